"""Checkpoints saved by 2 XLA ranks resume on XLA and on DeepSpeed's CPU accelerator.

One XLA run trains 6 steps and saves after step 3; resuming from that checkpoint must
reproduce steps 4-6 of the uninterrupted run, on XLA and on CPU (the checkpoint holds
host tensors, see deepspeed_xla/checkpointing.py), within the fp32 tolerance.
"""

import pytest

from harness.candidates import parse_spec
from harness.training import FIXTURES, compare_losses, describe_mismatch, run_training

TRAIN = FIXTURES / "train.py"


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_saved_on_xla_resumes_on_xla_and_cpu(stage, tmp_path):
    config = FIXTURES / "configs" / f"zero{stage}.json"
    ckpt = tmp_path / "ckpt"
    xla = parse_spec("deepspeed_xla")
    full = run_training(TRAIN, config, xla, tmp_path / "save", world_size=2, launcher="deepspeed", steps=6,
                        extra_args=["--save-dir", ckpt, "--save-after", "3"]).losses
    assert (ckpt / "latest").read_text().strip() == "global_step3"
    for accelerator, candidate in (("xla", xla), ("cpu", None)):
        run = run_training(TRAIN, config, candidate, tmp_path / f"load-{accelerator}", world_size=2,
                           launcher="deepspeed", steps=6, extra_args=["--load-dir", ckpt])
        resumed, device = run.losses, run.device
        assert device == ("xla:0" if accelerator == "xla" else "cpu")
        evidence = compare_losses(full[3:], resumed, "fp32")
        print(f"zero{stage} resumed on {accelerator}: {resumed} vs uninterrupted {full[3:]}")
        assert evidence["ok"], describe_mismatch(evidence, f"ZeRO-{stage} checkpoint resumed on {accelerator}")
