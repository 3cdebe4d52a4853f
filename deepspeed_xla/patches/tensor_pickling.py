"""Pickled XLA tensors that require grad load again (`torch.load`, `broadcast_object_list`).

torch pickles a tensor of a device without host-visible storage (XLA among them) as a host copy plus its
dtype, device and requires_grad, and rebuilds it with `torch._utils._rebuild_device_tensor_from_cpu_tensor`:
the host copy moved to the device, then `requires_grad` set on the result. The host copy of a tensor that
requires grad is pickled with requires_grad too, so the moved copy is the output of an autograd operation,
not a leaf, and setting the flag on it raises "you can only change requires_grad flags of leaf variables".
`torch.save`/`torch.load` of such a tensor failed that way in torch 2.9, and so did DeepSpeed's AutoTP
engine, which sends each forward's inputs across the tensor-parallel group with `broadcast_object_list`
(its TestSave::test_ckpt_save marks its inputs as requiring grad). CUDA tensors pickle their storage instead
and never take this path.

`install()` wraps the rebuild so the host copy is detached first: the tensor comes back a leaf on its device,
with the same values and requires_grad.
"""

import functools

import torch._utils

_MARK = "_deepspeed_xla_detached"


def _detaching(rebuild):
    @functools.wraps(rebuild)  # the same module and name: pickles keep naming torch's function
    def rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad):
        return rebuild(data.detach(), dtype, device, requires_grad)

    setattr(rebuild_device_tensor_from_cpu_tensor, _MARK, True)
    return rebuild_device_tensor_from_cpu_tensor


def install():
    """Wrap torch._utils._rebuild_device_tensor_from_cpu_tensor (idempotent)."""
    rebuild = torch._utils._rebuild_device_tensor_from_cpu_tensor
    if not getattr(rebuild, _MARK, False):
        torch._utils._rebuild_device_tensor_from_cpu_tensor = _detaching(rebuild)
