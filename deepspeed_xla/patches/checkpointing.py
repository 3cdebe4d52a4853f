"""DeepSpeed checkpoints written from XLA devices hold host tensors.

DeepSpeed saves its state dicts with `torch.save` (TorchCheckpointEngine). An XLA tensor
pickles as "a tensor on device xla:0", which only a process with torch_xla can load, and
not at all through the callable `map_location` DeepSpeed's loaders pass ("Callable
map_location not supported with ... _rebuild_device_tensor_from_numpy"). As
`torch_xla`'s own `xm.save` does, every XLA tensor in the state dict is moved to the host
before it is written: the checkpoint loads on XLA (DeepSpeed copies host values into the
device parameters) and on CPU alike, and `zero_to_fp32.py` reads it without torch_xla.

The engine's `save` is wrapped when its module loads (a post-import hook); DeepSpeed's files are
unchanged.

Shared (tied) parameters: DeepSpeed records which parameters share storage by
`param.data_ptr()` (`_get_shared_params`, saved as `shared_params` and used by
`zero_to_fp32` to rebuild the state dict). XLA tensors have no host address: data_ptr() is 0
for all of them, so every parameter was recorded as tied to the first, and zero_to_fp32 gave
each parameter the first one's values and shape. On XLA the engine tells tied parameters by
what tying makes them: the same Parameter object (`shared_params_by_identity`).
"""

import functools

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE
from . import DEEPSPEED_ENGINE

CHECKPOINT_ENGINE_MODULE = "deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine"


def to_host(obj):
    """`obj` with every XLA tensor inside dicts, lists and tuples replaced by its host copy."""
    import torch
    if isinstance(obj, torch.Tensor):
        if obj.device.type == DEVICE_TYPE:
            host = obj.detach().cpu()
            return host.requires_grad_(obj.requires_grad) if obj.is_leaf and obj.is_floating_point() else host
        return obj
    if isinstance(obj, dict):
        converted = {key: to_host(value) for key, value in obj.items()}
        try:
            result = type(obj)()
            result.update(converted)
            return result
        except TypeError:
            return converted
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(to_host(value) for value in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(value) for value in obj)
    return obj


def _saving_host_tensors(original):

    @functools.wraps(original)
    def save(self, state_dict, path):
        return original(self, to_host(state_dict), path)

    return save


def wrap_engine(module):
    """Post-import hook body: wrap `module`'s TorchCheckpointEngine.save so the state dict goes through to_host() before
    torch.save (idempotent, wrap_once)."""
    wrap_once(module.TorchCheckpointEngine, "save", _saving_host_tensors)


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


_HOOKS = (PostImportHook(CHECKPOINT_ENGINE_MODULE, wrap_engine),
          PostImportHook(DEEPSPEED_ENGINE, _tell_shared_params_by_identity))


def install():
    """Save host tensors through DeepSpeed's torch checkpoint engine, and tell tied parameters by identity in
    DeepSpeedEngine, each when its module loads, or now if it has (idempotent)."""
    for hook in _HOOKS:
        arm(hook)
