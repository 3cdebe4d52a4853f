"""Activation checkpointing does not change the training trajectory on the candidate.

fixtures/train_dropout.py puts dropout inside a `deepspeed.checkpointing.checkpoint` block.
DeepSpeed saves the device RNG state before the block's forward pass, restores it to
recompute the block in the backward pass, then restores the state it had before: the
recomputed dropout mask must be the original one, and the generator must end where the
plain run leaves it, so the checkpointed and the plain run of the same seeded script agree
loss by loss (as they do on DeepSpeed's CPU accelerator). The reference here is the
candidate's own plain run: dropout streams differ between devices, so the CPU curve cannot be.
"""

import pytest
from assertions import assert_losses_match

from harness.training.training_cases import TrainingCase

pytestmark = pytest.mark.area("scripts")

STEPS = 6


@pytest.mark.parametrize("config", ["zero2", "zero3"])
def test_activation_checkpointing_keeps_the_training_trajectory(config, candidate, evidence, tmp_path):
    runs = {}
    for mode, args in (("plain", ()), ("checkpointed", ("--checkpoint-activations", ))):
        case = TrainingCase("scripts", f"dropout-{mode}-{config}-1rank", "train_dropout.py", f"configs/{config}.json",
                            "fp32", 1, STEPS, args)
        runs[mode] = case.run(candidate, tmp_path / mode)
    evidence.update(config=config)
    assert_losses_match(runs["plain"].losses, runs["checkpointed"], "fp32", evidence, f"activation checkpointing with {config}",
                        reference="the plain run of the same seeded script")
