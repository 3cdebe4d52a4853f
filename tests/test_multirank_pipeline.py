"""Pipeline parallelism on emulated XLA ranks matches DeepSpeed's CPU accelerator.

fixtures/train_pipe.py is a plain PipelineModule script (2 stages; with 4 ranks, 2
pipelines side by side); each step runs 2 micro-batches through the pipeline
(gradient accumulation), optionally with activation checkpointing. The CPU run is the
reference, in the same session.
"""

import pytest

from harness.candidates import parse_spec
from harness.training import FIXTURES, compare_losses, describe_mismatch, run_training

SCRIPT = FIXTURES / "train_pipe.py"
CONFIG = FIXTURES / "configs" / "pipe.json"
STEPS = 4

CASES = {
    "2stages-2ranks": (2, []),
    "2stages-x2dp-4ranks": (4, []),
    "2stages-2ranks-activation-checkpointing": (2, ["--activation-checkpoint-interval", "1"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_pipeline_matches_cpu(case, tmp_path):
    world_size, extra = CASES[case]
    args = ["--stages", "2", *extra]
    runs = {name: run_training(SCRIPT, CONFIG, candidate, tmp_path / name, world_size=world_size, steps=STEPS,
                               launcher="deepspeed", extra_args=args)
            for name, candidate in (("cpu", None), ("xla", parse_spec("deepspeed_xla")))}
    assert runs["xla"].device == "xla:0" and runs["cpu"].device == "cpu"
    evidence = compare_losses(runs["cpu"].losses, runs["xla"].losses, "fp32")
    assert evidence["ok"], describe_mismatch(evidence, f"pipeline {case}")
