"""Pipeline parallelism (deepspeed.pipe.PipelineModule) trains on the candidate exactly as on
DeepSpeed's CPU accelerator.

fixtures/train_pipe.py is a plain PipelineModule script: 2 stages, and with 4 ranks two
pipelines side by side (data parallel); every step runs 2 micro-batches through the
pipeline (gradient accumulation), optionally recomputing each layer in backward
(activation checkpointing). The cases are the `pipeline` table of
fixtures/training_cases.toml; every run starts through DeepSpeed's own launcher, the CPU
reference live in this run or stored (harness/training/references.py). Stage-to-stage activations
and gradients travel by send/recv, so a candidate's point-to-point path is exercised here
and nowhere else.
"""

import pytest
from conformance_helpers import training_case_params

pytestmark = pytest.mark.area("pipeline")


@pytest.mark.parametrize("case", training_case_params("pipeline"))
def test_pipeline_loss_matches_cpu_reference(case, trains_like_reference):
    trains_like_reference(case, f"{case.id}: 2-stage pipeline on {case.ranks} ranks")
