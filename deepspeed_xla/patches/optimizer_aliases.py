"""Parameters that an optimizer updated through `p.data` are current when its step returns.

DeepSpeed's fused optimizers (FusedAdam, FusedLamb, FusedLion) hand their kernels `p.data` for each parameter, and
the kernels update those aliases in place. In torch 2.9 every XLA tensor is a functional tensor: an in-place update
of an alias is recorded on the storage the alias shares with the parameter, and the parameter object itself catches
up only when an operation syncs it. Operations sync their inputs first; view operations (`narrow`, `view`, slicing)
do not, so a view of the parameter taken after the step is a pending computation on the value before the step.
When the step's graph ran, torch_xla donated that value's buffer to the update (the parameter is updated in place),
and the next graph that computes the view reads a deleted buffer: "buffer with shape f32[N] ... is deleted".
DeepSpeed takes such views after a step when ZeRO-1/2 re-link their fp32 master fragments (`_link_all_hp_params`):
in `load_checkpoint` in the same process, and in `offload_states(include=[lp_params])`.

`install()` registers a global step post-hook with torch.optim that syncs each XLA parameter of the optimizer with
its storage (`torch._sync`). A parameter already current is left alone, one behind takes the storage's value: no
value changes, and the parameter is the same tensor as the step's output, so no graph gains an output.
"""

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..backend import DEVICE_TYPE

_handle = None  # the registered hook's handle: one per process


def sync_parameters(optimizer, args=None, kwargs=None):
    """Bring every XLA parameter of `optimizer` (a torch.optim.Optimizer) up to date with the in-place updates made
    through its aliases; the signature of a torch.optim step post-hook."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.device.type == DEVICE_TYPE and torch._is_functional_tensor(param):
                torch._sync(param)


def install():
    """Register `sync_parameters` as a global optimizer step post-hook (idempotent)."""
    global _handle
    if _handle is None:
        _handle = register_optimizer_step_post_hook(sync_parameters)
