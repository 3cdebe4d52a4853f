"""ZeRO stages 0-3 train on the candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train.py (a plain DeepSpeed script) runs on the candidate and on the CPU
accelerator (live in this run, or its stored curve: harness/references.py), started as a
user starts it: one rank as `python train.py`, more ranks through DeepSpeed's own launcher
(`deepspeed --num_gpus N`). The cases are the `zero` table of fixtures/training_cases.toml.
Every step's loss must agree within fixtures/tolerances.toml. A loss that merely goes down
proves nothing: an accelerator whose fused optimizer kernel computes garbage still drifts
downward.
"""

import pytest
from conformance_helpers import assert_trains_like_reference

from harness.training_cases import training_cases

pytestmark = pytest.mark.area("zero")

CASES = training_cases("zero")


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_zero_stage_loss_matches_cpu_reference(case, candidate, reference, evidence, tmp_path):
    assert_trains_like_reference(case, candidate, reference(case), evidence, tmp_path / "candidate",
                                 f"{case.config} on {case.ranks} rank(s)")
