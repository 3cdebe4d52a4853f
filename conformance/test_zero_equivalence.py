"""ZeRO stages 0-3 train on the candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train.py (a plain DeepSpeed script) runs on the candidate and on the CPU
accelerator (live in this run, or its stored curve: harness/training/references.py), started as a
user starts it: one rank as `python train.py`, more ranks through DeepSpeed's own launcher
(`deepspeed --num_gpus N`). The cases are the `zero` table of fixtures/training_cases.toml.
A case whose config DeepSpeed's CPU accelerator cannot train (ZeRO++'s quantized weights) is compared
with the same training without that feature, within its own tolerance row, and must show the feature
ran (what DeepSpeed's quantizer quantized).
Every step's loss must agree within fixtures/tolerances.toml. A loss that merely goes down
proves nothing: an accelerator whose fused optimizer kernel computes garbage still drifts
downward.
"""

import pytest
from conformance_helpers import training_case_params

pytestmark = pytest.mark.area("zero")


@pytest.mark.parametrize("case", training_case_params("zero"))
def test_zero_stage_loss_matches_cpu_reference(case, trains_like_reference, evidence):
    what = f"{case.config} on {case.ranks} rank(s)"
    run = trains_like_reference(case, what)
    if case.area_fields.get("quantized_weights"):
        quantized = run.reported.get("quantized_sizes")
        evidence.update(quantized_sizes=quantized)
        assert quantized, (f"{what}: DeepSpeed's quantizer quantized no tensor (reported {quantized!r}): the "
                           "all-gathers ran unquantized, so the comparison with the unquantized reference shows "
                           "nothing of ZeRO++'s quantized weights")
