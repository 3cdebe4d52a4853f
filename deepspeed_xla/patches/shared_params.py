"""Tied parameters in DeepSpeed checkpoints written from XLA, told by identity.

Shared (tied) parameters: DeepSpeed records which parameters share storage by
`param.data_ptr()` (`_get_shared_params`, saved as `shared_params` and used by
`zero_to_fp32` to rebuild the state dict). XLA tensors have no host address: data_ptr() is 0
for all of them, so every parameter was recorded as tied to the first, and zero_to_fp32 gave
each parameter the first one's values and shape. On XLA the engine tells tied parameters by
what tying makes them: the same Parameter object (`shared_params_by_identity`).
The engine's method is wrapped when DeepSpeed's engine module loads; DeepSpeed's files are unchanged.
"""

import functools

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE
from . import DEEPSPEED_ENGINE


def shared_params_by_identity(engine, original):
    """DeepSpeedEngine._get_shared_params with parameter identity for data_ptr on XLA (ZeRO-3's
    ds_id and other devices keep DeepSpeed's own answer)."""
    zero3 = engine.zero_optimization_partition_weights() and any(
        hasattr(param, "ds_id") for param in engine.module.parameters())
    if zero3 or engine.device.type != DEVICE_TYPE:
        return original(engine)
    import deepspeed.comm as dist
    if dist.get_rank() != 0:
        return {}
    first_name, shared = {}, {}
    for name, param in engine.module.named_parameters(remove_duplicate=False):
        if id(param) in first_name:
            shared[name] = first_name[id(param)]
        else:
            first_name[id(param)] = name
    return shared


def _telling_tied_params_by_identity(original):

    @functools.wraps(original)
    def wrapper(engine):
        return shared_params_by_identity(engine, original)

    return wrapper


def _tell_shared_params_by_identity(engine_module):
    wrap_once(engine_module.DeepSpeedEngine, "_get_shared_params", _telling_tied_params_by_identity)


_HOOK = PostImportHook(DEEPSPEED_ENGINE, _tell_shared_params_by_identity)


def install():
    """Tell tied parameters by identity in DeepSpeedEngine._get_shared_params, when the engine module loads, or now if
    it has (idempotent)."""
    arm(_HOOK)
