"""ZeRO stages 0-3 train on the candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train.py (a plain DeepSpeed script) runs once on the CPU accelerator and once on
the candidate, started as a user starts it: one rank as `python train.py`, more ranks
through DeepSpeed's own launcher (`deepspeed --num_gpus N`). Every step's loss must
agree within fixtures/tolerances.toml. A loss that merely goes down proves nothing: an
accelerator whose fused optimizer kernel computes garbage still drifts downward.
"""

import pytest

from harness.candidates import spec_from_env
from harness.training import FIXTURES, compare_losses, describe_mismatch, run_training

pytestmark = pytest.mark.area("zero")

SCRIPT = FIXTURES / "train.py"
STEPS = 4


def _case(stage, precision, ranks, config=None, extra_args=()):
    config = config or f"zero{stage}{'_bf16' if precision == 'bf16' else ''}"
    suffix = "-accum2-activation-checkpointing" if extra_args else ""
    return pytest.param(config, precision, ranks, tuple(extra_args), id=f"zero{stage}-{precision}-{ranks}rank{suffix}")


CASES = [
    *(_case(stage, precision, ranks) for ranks in (1, 2) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")),
    # two micro-batches per step, hidden layers recomputed in backward (deepspeed.checkpointing)
    _case(2, "fp32", 2, config="zero2_accum", extra_args=["--activation-checkpointing"]),
]

_references = {}


def train(config, ranks, extra_args, candidate, workdir):
    return run_training(SCRIPT, FIXTURES / "configs" / f"{config}.json", candidate, workdir, world_size=ranks,
                        steps=STEPS, launcher="python" if ranks == 1 else "deepspeed", extra_args=extra_args)


@pytest.mark.parametrize("config,precision,ranks,extra_args", CASES)
def test_zero_stage_loss_matches_cpu_reference(config, precision, ranks, extra_args, evidence, tmp_path):
    key = (config, ranks, extra_args)
    if key not in _references:  # computed once per run, in the same run
        _references[key] = train(config, ranks, extra_args, None, tmp_path / "reference").losses
    candidate = train(config, ranks, extra_args, spec_from_env(), tmp_path / "candidate")
    comparison = compare_losses(_references[key], candidate.losses, precision)
    evidence.update(comparison, config=config, ranks=ranks, device=candidate.device)
    assert candidate.device.startswith("xla"), f"the candidate trained on {candidate.device}, not on an XLA device"
    assert comparison["ok"], describe_mismatch(comparison, f"{config} on {ranks} rank(s)")
