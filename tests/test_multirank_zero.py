"""ZeRO 0-3 on 2 and 4 emulated XLA ranks match DeepSpeed's CPU accelerator step by step.

Both runs start the same unmodified script the way a user would,
`DS_ACCELERATOR=xla|cpu deepspeed --num_gpus N fixtures/train.py ...`; the CPU run
(gloo) is the reference, computed in the same session and cached per configuration.
Tolerances: fixtures/tolerances.toml (fp32: 1e-5 relative, anything beyond is a bug;
bf16: 2e-3, justified there with the measured gap).
"""

import sys

import pytest

from harness.training import FIXTURES, compare_losses, describe_mismatch

sys.path.insert(0, str(FIXTURES))
from multirank import train  # noqa: E402

TRAIN = FIXTURES / "train.py"
CONFIGS = FIXTURES / "configs"
STEPS = 4

_references = {}


def reference(config, world_size, workdir, extra_args=()):
    key = (str(config), world_size, tuple(extra_args))
    if key not in _references:
        _references[key] = train(TRAIN, config, "cpu", workdir, world_size=world_size, steps=STEPS,
                                 extra_args=extra_args)
    return _references[key]


def check(config, precision, world_size, tmp_path, extra_args=()):
    ref_losses, ref_device = reference(config, world_size, tmp_path / "cpu", extra_args)
    losses, device = train(TRAIN, config, "xla", tmp_path / "xla", world_size=world_size, steps=STEPS,
                           extra_args=extra_args)
    assert device == "xla:0" and ref_device == "cpu", (device, ref_device)
    evidence = compare_losses(ref_losses, losses, precision)
    print(f"{config.name} x{world_size}: max rel err {evidence['max_rel_err']:.3g} "
          f"(rtol {evidence['rtol']:g}) xla={losses} cpu={ref_losses}")
    assert evidence["ok"], describe_mismatch(evidence, f"{config.name} on {world_size} ranks")


CASES = [(stage, precision) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")]


@pytest.mark.slow
@pytest.mark.parametrize("stage,precision", CASES, ids=[f"zero{s}-{p}" for s, p in CASES])
def test_two_ranks_match_cpu(stage, precision, tmp_path):
    config = CONFIGS / f"zero{stage}{'_bf16' if precision == 'bf16' else ''}.json"
    check(config, precision, 2, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_four_ranks_match_cpu(stage, tmp_path):
    check(CONFIGS / f"zero{stage}.json", "fp32", 4, tmp_path)


@pytest.mark.slow
def test_zero2_gradient_accumulation_and_activation_checkpointing(tmp_path):
    # 2 micro-batches per step, hidden layers recomputed in backward (deepspeed.checkpointing).
    check(CONFIGS / "zero2_accum.json", "fp32", 2, tmp_path, extra_args=["--activation-checkpointing"])
