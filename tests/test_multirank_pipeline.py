"""Pipeline parallelism on emulated XLA ranks matches DeepSpeed's CPU accelerator.

fixtures/train_pipe.py is a plain PipelineModule script (2 stages; with 4 ranks, 2
pipelines side by side); each step runs 2 micro-batches through the pipeline
(gradient accumulation), optionally with activation checkpointing. The CPU run is the
reference, in the same session.
"""

import sys

import pytest

from harness.training import FIXTURES, compare_losses, describe_mismatch

sys.path.insert(0, str(FIXTURES))
from multirank import train  # noqa: E402

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
    ref, ref_device = train(SCRIPT, CONFIG, "cpu", tmp_path / "cpu", world_size=world_size, steps=STEPS,
                            extra_args=args)
    losses, device = train(SCRIPT, CONFIG, "xla", tmp_path / "xla", world_size=world_size, steps=STEPS,
                           extra_args=args)
    assert device == "xla:0" and ref_device == "cpu"
    evidence = compare_losses(ref, losses, "fp32")
    print(f"{case}: max rel err {evidence['max_rel_err']:.3g} xla={losses} cpu={ref}")
    assert evidence["ok"], describe_mismatch(evidence, f"pipeline {case}")
