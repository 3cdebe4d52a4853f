"""ZeRO stages 0-3 on one XLA device match DeepSpeed's CPU accelerator step by step.

fixtures/train.py is a plain DeepSpeed script; it runs twice per case, as a user would:
`DS_ACCELERATOR=cpu python train.py` (reference) and `DS_ACCELERATOR=xla python train.py`.
A loss that merely goes down proves nothing (a broken fused optimizer still drifts
downward), so every step is compared within fixtures/tolerances.toml.
"""

import pytest

from harness.training import FIXTURES, compare_losses, describe_mismatch, run_training

SCRIPT = FIXTURES / "train.py"
CASES = [(stage, precision) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")]


@pytest.mark.slow
@pytest.mark.parametrize("stage,precision", CASES, ids=[f"zero{s}-{p}" for s, p in CASES])
def test_zero_stage_matches_cpu_reference(stage, precision, tmp_path):
    config = FIXTURES / "configs" / f"zero{stage}{'_bf16' if precision == 'bf16' else ''}.json"
    reference = run_training(SCRIPT, config, "cpu", tmp_path)
    candidate = run_training(SCRIPT, config, "xla", tmp_path)

    assert candidate.device == "xla:0", f"the XLA run trained on {candidate.device}, not on the XLA device xla:0"
    assert reference.device == "cpu", f"the reference run trained on {reference.device}, not on the CPU"
    evidence = compare_losses(reference.losses, candidate.losses, precision)
    assert evidence["ok"], describe_mismatch(evidence, f"ZeRO-{stage} {precision}")
