"""ZeRO stages 0-3 train on the candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train.py (a plain DeepSpeed script) runs on the candidate and on the CPU
accelerator (live in this run, or its stored curve: harness/training/references.py), started as a
user starts it: one rank as `python train.py`, more ranks through DeepSpeed's own launcher
(`deepspeed --num_gpus N`). The cases are the `zero` table of fixtures/training_cases.toml.
Every step's loss must agree within fixtures/tolerances.toml. A loss that merely goes down
proves nothing: an accelerator whose fused optimizer kernel computes garbage still drifts
downward.
"""

import pytest
from conformance_helpers import training_case_params

pytestmark = pytest.mark.area("zero")


@pytest.mark.parametrize("case", training_case_params("zero"))
def test_zero_stage_loss_matches_cpu_reference(case, trains_like_reference):
    trains_like_reference(case, f"{case.config} on {case.ranks} rank(s)")
