"""Assertions shared by conformance checks. A failure message stands on its own in a report: what
was called, what came back, what was expected, on which device and in which dtype.

Helpers that run things (fresh processes, training runs) and parametrize checks are in
conformance_helpers.py.
"""

import torch
from conformance_helpers import host

from harness.training.loss_comparison import compare_losses, describe_mismatch


def _call_text(method, *args, **kwargs):
    """How a message names a call: `method(arg, ..., key=value)`, each value as its repr."""
    shown = [repr(arg) for arg in args] + [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"{method}({', '.join(shown)})"


def returns(accel, method, *args, expected, accepts, **kwargs):
    """accel.<method>(*args, **kwargs), asserted to be what `expected` describes (`accepts(value)` is True)."""
    value = getattr(accel, method)(*args, **kwargs)
    assert accepts(value), (f"{_call_text(method, *args, **kwargs)} returned {value!r} ({type(value).__name__}), "
                            f"expected {expected}")
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def returns_bool(accel, method, *args, **kwargs):
    """accel.<method>(...), asserted to be a bool: DeepSpeed branches on these answers."""
    return returns(accel, method, *args, expected="a bool", accepts=lambda value: isinstance(value, bool), **kwargs)


def returns_index(accel, method, *args):
    """accel.<method>(...), asserted to be an int device index, as DeepSpeed uses it."""
    return returns(accel, method, *args, expected="an int device index", accepts=_is_int)


def returns_byte_count(accel, method, *args):
    """accel.<method>(...), asserted to be a byte count (an int >= 0), as see_memory_usage formats it."""
    return returns(accel, method, *args, expected="a byte count (int >= 0)",
                   accepts=lambda value: _is_int(value) and value >= 0)


def assert_tensor(tensor, what, *, device_type=None, dtype=None, shape=None, values=None, why=""):
    """Assert that `tensor`, which `what` gave (a call, or the work that computed it), is a tensor with
    each property given: on a `device_type` device, of `dtype` and `shape`, holding `values` (nested
    lists, read on the host). The message names every property that differs, got and expected, then
    `why` it matters."""
    assert isinstance(tensor, torch.Tensor), f"{what} gave {type(tensor).__name__}, expected a tensor"
    wrong = []
    if device_type is not None and tensor.device.type != device_type:
        wrong.append(f"on {tensor.device}, expected a device of type {device_type!r}")
    if dtype is not None and tensor.dtype != dtype:
        wrong.append(f"of dtype {tensor.dtype}, expected {dtype}")
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        wrong.append(f"of shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if values is not None and host(tensor).tolist() != values:
        wrong.append(f"holding {host(tensor).tolist()}, expected {values}")
    assert not wrong, f"{what} gave a tensor {'; '.join(wrong)}" + (f" ({why})" if why else "")


def assert_losses_match(expected, run, precision, evidence, what, *, device_type=None, reference="the CPU reference"):
    """Assert that training `run` (a harness TrainingRun) logged every step's loss within `precision`'s
    tolerance (fixtures/tolerances.toml) of `expected`, the losses of `reference`, and trained on a
    `device_type` device when one is given; evidence records the comparison and the device."""
    comparison = compare_losses(expected, run.losses, precision)
    evidence.update(comparison, device=run.device)
    if device_type is not None:
        assert run.device.startswith(device_type), f"{what}: trained on {run.device}, not on a device of type {device_type!r}"
    assert comparison["ok"], describe_mismatch(comparison, what, reference)


def assert_no_compilations_after_warmup(run, warmup_steps, evidence, what):
    """Assert that a TrainingRun compiled no XLA graph after its first `warmup_steps` steps (fixed shapes: each
    later step replays cached graphs); evidence records the cumulative count after each step."""
    assert run.compilations is not None, f"{what}: the script reported no XLA compilation counts (trained on {run.device})"
    added = run.compilations[-1] - run.compilations[warmup_steps - 1]
    evidence.update(compilations_after_each_step=run.compilations, warmup_steps=warmup_steps,
                    compilations_after_warmup=added)
    assert added == 0, (f"{what}: {added} new XLA compilations in the {len(run.compilations) - warmup_steps} steps after "
                        f"a warm-up of {warmup_steps} (cumulative after each step: {run.compilations}); at fixed shapes "
                        "each later step must replay a cached graph")
