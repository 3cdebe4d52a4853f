"""Checkpoints move between the candidate and DeepSpeed's CPU accelerator.

The cases are the `checkpoint` table of fixtures/training_cases.toml (ZeRO-2 and ZeRO-3 on 2
ranks through DeepSpeed's launcher): a run of the script saves a checkpoint after step
`save_after`. Resuming from it must reproduce the later steps of the uninterrupted run within the
case's tolerance:
- saved on the candidate, resumed on the candidate (save/load round trip on the device);
- saved on the candidate, resumed on CPU (the checkpoint must not hold device tensors, or
  a TPU-trained model cannot be evaluated or converted anywhere else);
- saved on CPU (or a GPU), resumed on the candidate (moving an existing job onto XLA).
"""

import pytest
from assertions import assert_losses_match
from conformance_helpers import training_case_params

pytestmark = pytest.mark.area("checkpoint")

_saved = {}  # (case id, saved on) -> (checkpoint dir, losses of the uninterrupted run); once per run


def _accelerator(where, candidate):
    """What a run on `where` ("candidate" or "cpu") trains on: the candidate, or None for DeepSpeed's CPU accelerator."""
    return candidate if where == "candidate" else None


def _checkpoint(case, saved_on, candidate, tmp_path_factory):
    key, save_after = (case.id, saved_on), case.area_fields["save_after"]
    if key not in _saved:
        workdir = tmp_path_factory.mktemp(f"{case.id}-saved-on-{saved_on}")
        ckpt = workdir / "checkpoint"
        run = case.run(_accelerator(saved_on, candidate), workdir, extra_args=["--save-dir", ckpt, "--save-after", save_after])
        latest = ckpt / "latest"
        assert latest.is_file() and latest.read_text().strip() == f"global_step{save_after}", (
            f"{case.config} on {saved_on}: save_checkpoint after step {save_after} left no "
            f"'latest' tag naming global_step{save_after} in {ckpt}")
        _saved[key] = (ckpt, run.losses)
    return _saved[key]


@pytest.mark.parametrize("case", training_case_params("checkpoint"))
@pytest.mark.parametrize("saved_on,resumed_on", [("candidate", "candidate"), ("candidate", "cpu"),
                                                 ("cpu", "candidate")],
                         ids=["candidate-to-candidate", "candidate-to-cpu", "cpu-to-candidate"])
def test_checkpoint_resumes_where_it_stopped(case, saved_on, resumed_on, candidate, evidence, tmp_path,
                                             tmp_path_factory):
    ckpt, uninterrupted = _checkpoint(case, saved_on, candidate, tmp_path_factory)
    resumed = case.run(_accelerator(resumed_on, candidate), tmp_path, extra_args=["--load-dir", ckpt])
    save_after = case.area_fields["save_after"]
    evidence.update(config=case.config, saved_on=saved_on, resumed_on=resumed_on)
    assert_losses_match(uninterrupted[save_after:], resumed, case.precision, evidence,
                        f"{case.config} checkpoint saved on {saved_on} after step {save_after}, resumed on {resumed_on}",
                        device_type="xla" if resumed_on == "candidate" else "cpu",
                        reference=f"steps {save_after + 1}-{case.steps} of the uninterrupted run")
