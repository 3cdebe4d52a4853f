"""DeepSpeed's overflow, inf/NaN and gradient-norm checks on XLA: the same answers, with fewer graph
executions and host transfers per step.

  - the mixed-precision overflow check (`CheckOverflow.has_overflow_serial`, which bf16 without ZeRO
    uses) asks each gradient in turn whether it holds inf or NaN, one host read and one graph
    execution per parameter tensor; on XLA the per-gradient answers are combined on the device and
    read once. The answer is the same: whether any gradient has inf or NaN;
  - the inf/NaN test of one gradient (`has_inf_or_nan`, which every overflow check calls) is, on XLA,
    whether all elements are finite: one reduction that XLA fuses with the test, where DeepSpeed's
    `amax` and `amin` run two that XLA CPU lowers as windowed reductions. Fused, the elementwise test
    allocates no mask (DeepSpeed's reason for reducing first);
  - ZeRO-1/2's step asks `is_invalid_grad_norm` twice about the same norm tensor (the overflow check in
    `step`, then the clipping check in `unscale_and_clip_grads`); on XLA the verdict is kept on the
    tensor for as long as it is unchanged (its version counter), so the second question needs no
    second graph execution and transfer;
  - DeepSpeed puts some host values into a device tensor only to all-reduce them over a group and read
    them back (`CheckOverflow.has_overflow`: `ByteTensor([overflow])`; `get_flattened_grad_norm`:
    `FloatTensor([norm])`, the fp32 rounding included). Where no group takes part (no model
    parallelism, no MoE, gradients already all-reduced), the accelerator's tensor types make that
    tensor on the host (`scalars_stay_on_host`): the same dtype and rounding, and no graph execution
    and transfer for a value the host already had.
The measurements: docs/step-graphs.md. `install()` wraps the functions once DeepSpeed's engine module
(which loads `deepspeed.runtime.utils`) has loaded; DeepSpeed's files are not touched.
"""

import functools
import sys
import threading

import torch

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE
from . import DEEPSPEED_ENGINE


def _finiteness_in_one_reduction(has_inf_or_nan):

    @functools.wraps(has_inf_or_nan)
    def wrapper(x):
        if x.device.type != DEVICE_TYPE or x.is_sparse or x.numel() == 0:
            return has_inf_or_nan(x)
        return torch.isfinite(x).all().logical_not()

    return wrapper


def _overflow_in_one_read(has_overflow_serial):

    @functools.wraps(has_overflow_serial)
    def wrapper(checker, params):
        params = list(params)  # DeepSpeed may pass a generator
        grads = [(i, p.grad.data) for i, p in enumerate(params) if p.grad is not None]
        if not grads or grads[0][1].device.type != DEVICE_TYPE:
            return has_overflow_serial(checker, params)
        flags = [checker._has_inf_or_nan(grad, i) for i, grad in grads]
        if not all(torch.is_tensor(flag) for flag in flags):  # a checker whose test answers on the host
            return any(map(bool, flags))
        return bool(torch.stack(flags).any())

    return wrapper


_round_trips = threading.local()  # .depth: how many host-value round trips this thread is inside


def scalars_stay_on_host():
    """Whether the accelerator's tensor types (`FloatTensor([x])`, ...) make host tensors now: inside one
    of DeepSpeed's host-value round trips that no collective takes part in, on this thread."""
    return getattr(_round_trips, "depth", 0) > 0


def _round_trip_on_host(exchanges):
    """Wrap a DeepSpeed function that puts a host value into a device tensor, all-reduces it where
    `exchanges(*args, **kwargs)` is true, and reads it back: where it is false, the tensor types
    make that tensor on the host for the call (see scalars_stay_on_host)."""

    def wrap(function):

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if exchanges(*args, **kwargs):
                return function(*args, **kwargs)
            _round_trips.depth = getattr(_round_trips, "depth", 0) + 1
            try:
                return function(*args, **kwargs)
            finally:
                _round_trips.depth -= 1

        return wrapper

    return wrap


def _overflow_is_exchanged(checker, params, has_moe_params=None):
    # CheckOverflow.has_overflow (DeepSpeed 0.19.8) all-reduces its flag exactly in these cases.
    engine = checker.deepspeed
    return bool((checker.has_moe_params if has_moe_params is None else has_moe_params) or checker.zero_reduce_scatter
                or checker.mpu is not None or (engine is not None and engine.enable_backward_allreduce is False))


def _norm_is_exchanged(parameters, norm_type=2, mpu=None, grad_norm_mask=None):
    # get_flattened_grad_norm all-reduces its norm over the model-parallel group only.
    return mpu is not None


_NORM_VERDICT = "_ds_xla_invalid_norm"  # (tensor version, verdict) kept on a norm tensor


def _norm_verdict_kept(is_invalid_grad_norm):

    @functools.wraps(is_invalid_grad_norm)
    def wrapper(norm):
        if not (torch.is_tensor(norm) and norm.device.type == DEVICE_TYPE):
            return is_invalid_grad_norm(norm)
        kept = getattr(norm, _NORM_VERDICT, None)
        if kept is not None and kept[0] == norm._version:
            return kept[1]
        verdict = is_invalid_grad_norm(norm)
        setattr(norm, _NORM_VERDICT, (norm._version, verdict))
        return verdict

    return wrapper


def _wrap_function(utils, name, wrap):
    # DeepSpeed's optimizers import these functions by name: rebind each wherever DeepSpeed already has.
    original = getattr(utils, name)
    wrap_once(utils, name, wrap)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("deepspeed.") and getattr(module, name, None) is original:
            setattr(module, name, getattr(utils, name))


def _patch(engine_module):
    from deepspeed.runtime import utils
    wrap_once(utils.CheckOverflow, "has_overflow_serial", _overflow_in_one_read)
    wrap_once(utils.CheckOverflow, "has_overflow", _round_trip_on_host(_overflow_is_exchanged))
    _wrap_function(utils, "is_invalid_grad_norm", _norm_verdict_kept)
    _wrap_function(utils, "has_inf_or_nan", _finiteness_in_one_reduction)
    _wrap_function(utils, "get_flattened_grad_norm", _round_trip_on_host(_norm_is_exchanged))


_HOOK = PostImportHook(DEEPSPEED_ENGINE, _patch)


def install():
    """Test gradients for inf/NaN in one reduction, read the overflow check's answer once per step, answer a norm's
    validity once, and keep host values that no collective needs on the host, once DeepSpeed's engine module loads
    (idempotent)."""
    arm(_HOOK)
