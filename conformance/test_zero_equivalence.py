"""ZeRO stages 0-3 train on the candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train.py (a plain DeepSpeed script) runs once on the CPU accelerator and once on
the candidate, started as a user starts it; every step's loss must agree within
fixtures/tolerances.toml. A loss that merely goes down proves nothing: an accelerator
whose fused optimizer kernel computes garbage still drifts downward.
"""

import functools

import pytest

from harness.candidates import spec_from_env
from harness.training import FIXTURES, compare_losses, describe_mismatch, run_training

pytestmark = pytest.mark.area("zero")

SCRIPT = FIXTURES / "train.py"
CASES = [(stage, precision) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")]


def config_for(stage, precision):
    return FIXTURES / "configs" / f"zero{stage}{'_bf16' if precision == 'bf16' else ''}.json"


@functools.cache
def _reference(config, workdir):
    return run_training(SCRIPT, config, None, workdir)


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory):
    """CPU-accelerator losses per config, computed once per run."""
    root = tmp_path_factory.mktemp("zero-reference")
    return lambda config: _reference(config, root / config.stem).losses


@pytest.mark.parametrize("stage,precision", CASES, ids=[f"zero{s}-{p}" for s, p in CASES])
def test_zero_stage_loss_matches_cpu_reference(stage, precision, reference_losses, evidence, tmp_path):
    config = config_for(stage, precision)
    reference = reference_losses(config)
    candidate = run_training(SCRIPT, config, spec_from_env(), tmp_path)
    comparison = compare_losses(reference, candidate.losses, precision)
    evidence.update(comparison, config=config.name, world_size=1, device=candidate.device)
    assert candidate.device.startswith("xla"), f"the candidate trained on {candidate.device}, not on an XLA device"
    assert comparison["ok"], describe_mismatch(comparison, f"ZeRO-{stage} {precision}")
