"""`torch.xla`: the device runtime module PyTorch's generic code looks up by device type.

PyTorch finds a device's runtime as `getattr(torch, device.type)` (`torch.cuda`, `torch.xpu`,
...). `torch.utils.checkpoint`, behind HuggingFace-style gradient checkpointing, saves and
restores the RNG state of the devices its inputs live on through it, and fails on XLA with
`module 'torch' has no attribute 'xla'`: torch_xla 2.9 registers no such module. `register()`
registers one (`torch._register_device_module`) whose RNG functions are the accelerator's
(see rng.py), so a recomputed forward replays the same dropout masks and leaves the random
stream where an uncheckpointed run would. One process owns one XLA device, so `device(i)`
only names it.
"""

import contextlib
import types

import torch


def build(accelerator):
    """A module with the runtime API torch.utils.checkpoint uses, served by `accelerator`."""
    module = types.ModuleType("torch.xla", __doc__)
    module._initialized = True  # torch.utils.checkpoint saves device RNG states only for initialised devices
    module.is_available = accelerator.is_available
    module.device_count = accelerator.device_count
    module.current_device = accelerator.current_device
    module.device = lambda index=None: contextlib.nullcontext(index)
    module.get_rng_state = lambda device=None: accelerator.get_rng_state()
    module.set_rng_state = lambda state, device=None: accelerator.set_rng_state(state)
    module.manual_seed = accelerator.manual_seed
    module.manual_seed_all = accelerator.manual_seed_all
    module.synchronize = lambda device=None: accelerator.synchronize()
    return module


def register(accelerator):
    """Register `torch.xla` for this process unless something already did."""
    if not hasattr(torch, "xla"):
        torch._register_device_module("xla", build(accelerator))
