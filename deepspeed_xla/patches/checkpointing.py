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
"""

import functools

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE

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


_HOOK = PostImportHook(CHECKPOINT_ENGINE_MODULE, wrap_engine)


def install():
    """Save host tensors through DeepSpeed's torch checkpoint engine, when its module loads, or now if it has
    (idempotent)."""
    arm(_HOOK)
