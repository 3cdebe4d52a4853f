"""`torch.xla`: the device runtime module PyTorch's generic code looks up by device type.

PyTorch finds a device's runtime as `getattr(torch, device.type)` (`torch.cuda`, `torch.xpu`,
...). `torch.utils.checkpoint`, behind HuggingFace-style gradient checkpointing, saves and
restores the RNG state of the devices its inputs live on through it, and fails on XLA with
`module 'torch' has no attribute 'xla'`: torch_xla 2.9 registers no such module. `install()`
registers one (`torch._register_device_module`) whose RNG functions are the accelerator's
(see rng.py), so a recomputed forward replays the same dropout masks and leaves the random
stream where an uncheckpointed run would. One process owns one XLA device, so `device(i)`
only names it.
"""

import contextlib
import types

import torch


def build(accelerator):
    """A module with the runtime API torch.utils.checkpoint uses, served by `accelerator` (each attribute looked up
    at the call)."""
    module = types.ModuleType("torch.xla", __doc__)
    module._initialized = True  # torch.utils.checkpoint saves device RNG states only for initialised devices
    module.is_available = lambda: accelerator.is_available()
    module.device_count = lambda: accelerator.device_count()
    module.current_device = lambda: accelerator.current_device()
    module.device = lambda index=None: contextlib.nullcontext(index)
    module.get_rng_state = lambda device=None: accelerator.get_rng_state()
    module.set_rng_state = lambda state, device=None: accelerator.set_rng_state(state)
    module.manual_seed = lambda seed: accelerator.manual_seed(seed)
    module.manual_seed_all = lambda seed: accelerator.manual_seed_all(seed)
    module.synchronize = lambda device=None: accelerator.synchronize()
    return module


class _CurrentAccelerator:
    """DeepSpeed's accelerator of the moment (`get_accelerator()`), asked at each call: the module is registered
    while that accelerator is being built."""

    def __getattr__(self, name):
        from deepspeed.accelerator import get_accelerator
        return getattr(get_accelerator(), name)


def install():
    """Register `torch.xla`, served by DeepSpeed's accelerator, for this process unless something already did."""
    if not hasattr(torch, "xla"):
        torch._register_device_module("xla", build(_CurrentAccelerator()))
