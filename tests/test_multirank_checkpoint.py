"""Checkpoints saved by 2 XLA ranks resume on XLA and on DeepSpeed's CPU accelerator.

One XLA run trains 6 steps and saves after step 3; resuming from that checkpoint must
reproduce steps 4-6 of the uninterrupted run, on XLA and on CPU (the checkpoint holds
host tensors, see deepspeed_xla/checkpointing.py), within the fp32 tolerance.
"""

import sys

import pytest

from harness.training import FIXTURES, compare_losses, describe_mismatch

sys.path.insert(0, str(FIXTURES))
from multirank import train  # noqa: E402

TRAIN = FIXTURES / "train.py"


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_saved_on_xla_resumes_on_xla_and_cpu(stage, tmp_path):
    config = FIXTURES / "configs" / f"zero{stage}.json"
    ckpt = tmp_path / "ckpt"
    full, _ = train(TRAIN, config, "xla", tmp_path / "save", steps=6,
                    extra_args=["--save-dir", ckpt, "--save-after", "3"])
    assert (ckpt / "latest").read_text().strip() == "global_step3"
    for accelerator in ("xla", "cpu"):
        resumed, device = train(TRAIN, config, accelerator, tmp_path / f"load-{accelerator}", steps=6,
                                extra_args=["--load-dir", ckpt])
        assert device == ("xla:0" if accelerator == "xla" else "cpu")
        evidence = compare_losses(full[3:], resumed, "fp32")
        print(f"zero{stage} resumed on {accelerator}: {resumed} vs uninterrupted {full[3:]}")
        assert evidence["ok"], describe_mismatch(evidence, f"ZeRO-{stage} checkpoint resumed on {accelerator}")
