"""The torch.distributed backend DeepSpeed uses on XLA devices.

One backend name, two transports: on PJRT CPU a host bridge (each rank owns one PJRT
CPU device; tensors cross ranks through gloo, because PJRT CPU has no cross-process
collectives); on TPU and other XLA hardware, the device's own collectives. Both are
registered with torch.distributed the standard way, so DeepSpeed's
`init_distributed` picks them up through `communication_backend_name()` unchanged.
"""

import torch.distributed as dist

BACKEND_NAME = "xla_ds"


def _create_process_group(store, rank, size, timeout):
    from .bridge import HostBridgeProcessGroup
    return HostBridgeProcessGroup(store, rank, size, timeout)


def register_backend():
    """Make `BACKEND_NAME` known to torch.distributed (idempotent)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["xla", "cpu"])
