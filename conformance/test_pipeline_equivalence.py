"""Pipeline parallelism (deepspeed.pipe.PipelineModule) trains on the candidate exactly as on
DeepSpeed's CPU accelerator.

fixtures/train_pipe.py is a plain PipelineModule script: 2 stages, and with 4 ranks two
pipelines side by side (data parallel); every step runs 2 micro-batches through the
pipeline (gradient accumulation), optionally recomputing each layer in backward
(activation checkpointing). Both runs start through DeepSpeed's own launcher; the CPU run
is the reference, in the same session. Stage-to-stage activations and gradients travel by
send/recv, so a candidate's point-to-point path is exercised here and nowhere else.
"""

import pytest

from harness.candidates import spec_from_env
from harness.training import FIXTURES, compare_losses, describe_mismatch, run_training

pytestmark = pytest.mark.area("pipeline")

SCRIPT = FIXTURES / "train_pipe.py"
CONFIG = FIXTURES / "configs" / "pipe.json"
STEPS = 4

CASES = [
    pytest.param(2, (), id="2stages-2ranks"),
    pytest.param(4, (), id="2stages-x2dp-4ranks"),
    pytest.param(2, ("--activation-checkpoint-interval", "1"), id="2stages-2ranks-activation-checkpointing"),
]


@pytest.mark.parametrize("ranks,extra_args", CASES)
def test_pipeline_loss_matches_cpu_reference(ranks, extra_args, evidence, tmp_path):
    args = ["--stages", "2", *extra_args]
    runs = {name: run_training(SCRIPT, CONFIG, candidate, tmp_path / name, world_size=ranks, steps=STEPS,
                               launcher="deepspeed", extra_args=args)
            for name, candidate in (("reference", None), ("candidate", spec_from_env()))}
    comparison = compare_losses(runs["reference"].losses, runs["candidate"].losses, "fp32")
    evidence.update(comparison, ranks=ranks, stages=2, device=runs["candidate"].device)
    assert runs["candidate"].device.startswith("xla"), (
        f"the candidate trained on {runs['candidate'].device}, not on an XLA device")
    assert comparison["ok"], describe_mismatch(comparison, f"2-stage pipeline on {ranks} ranks")
