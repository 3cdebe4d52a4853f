"""Checkpoints move between the candidate and DeepSpeed's CPU accelerator (ZeRO-2 and ZeRO-3,
2 ranks through DeepSpeed's launcher).

A run of fixtures/train.py trains 6 steps and saves a checkpoint after step 3. Resuming from
it must reproduce steps 4-6 of the uninterrupted run within the fp32 tolerance:
- saved on the candidate, resumed on the candidate (save/load round trip on the device);
- saved on the candidate, resumed on CPU (the checkpoint must not hold device tensors, or
  a TPU-trained model cannot be evaluated or converted anywhere else);
- saved on CPU (or a GPU), resumed on the candidate (moving an existing job onto XLA).
"""

import pytest

from harness.loss_comparison import compare_losses, describe_mismatch
from harness.paths import FIXTURES
from harness.training import run_training

pytestmark = pytest.mark.area("checkpoint")

SCRIPT = FIXTURES / "train.py"
RANKS = 2
STEPS = 6
SAVE_AFTER = 3
STAGES = (2, 3)

_saved = {}  # (stage, saved on) -> (checkpoint dir, losses of the uninterrupted run); once per run


def _train(stage, accelerator, workdir, extra_args):
    """Train on `accelerator` (a CandidateSpec; None: DeepSpeed's CPU accelerator)."""
    return run_training(SCRIPT, FIXTURES / "configs" / f"zero{stage}.json", accelerator, workdir,
                        world_size=RANKS, steps=STEPS, launcher="deepspeed", extra_args=extra_args)


def _checkpoint(stage, saved_on, candidate, tmp_path_factory):
    key = (stage, saved_on)
    if key not in _saved:
        workdir = tmp_path_factory.mktemp(f"zero{stage}-saved-on-{saved_on}")
        ckpt = workdir / "checkpoint"
        run = _train(stage, candidate if saved_on == "candidate" else None, workdir,
                     ["--save-dir", ckpt, "--save-after", SAVE_AFTER])
        latest = ckpt / "latest"
        assert latest.is_file() and latest.read_text().strip() == f"global_step{SAVE_AFTER}", (
            f"ZeRO-{stage} on {saved_on}: save_checkpoint after step {SAVE_AFTER} left no "
            f"'latest' tag naming global_step{SAVE_AFTER} in {ckpt}")
        _saved[key] = (ckpt, run.losses)
    return _saved[key]


@pytest.mark.parametrize("stage", STAGES, ids=[f"zero{stage}" for stage in STAGES])
@pytest.mark.parametrize("saved_on,resumed_on", [("candidate", "candidate"), ("candidate", "cpu"),
                                                 ("cpu", "candidate")],
                         ids=["candidate-to-candidate", "candidate-to-cpu", "cpu-to-candidate"])
def test_checkpoint_resumes_where_it_stopped(stage, saved_on, resumed_on, candidate, evidence, tmp_path,
                                             tmp_path_factory):
    ckpt, uninterrupted = _checkpoint(stage, saved_on, candidate, tmp_path_factory)
    resumed = _train(stage, candidate if resumed_on == "candidate" else None, tmp_path, ["--load-dir", ckpt])
    comparison = compare_losses(uninterrupted[SAVE_AFTER:], resumed.losses, "fp32")
    evidence.update(comparison, stage=stage, saved_on=saved_on, resumed_on=resumed_on, device=resumed.device)
    assert resumed.device.startswith("xla" if resumed_on == "candidate" else "cpu"), (
        f"the run resumed on {resumed_on} trained on {resumed.device}")
    assert comparison["ok"], describe_mismatch(
        comparison, f"ZeRO-{stage} checkpoint saved on {saved_on} after step {SAVE_AFTER}, resumed on {resumed_on}, "
        f"against steps {SAVE_AFTER + 1}-{STEPS} of the uninterrupted run")
