"""Device kind and count on this host, from the environment and the PCI bus, without torch_xla."""

import os

from .tpu_topology import count_tpu_chips

# PJRT CPU: how many emulated devices (one per rank) a single host offers when no
# launcher has said how many local ranks there are.
CPU_DEVICES_ENV = "DS_XLA_CPU_DEVICES"


def device_type(environ=None):
    """The PJRT device kind ("TPU", "CPU", ...) without initialising the runtime.

    PyTorch/XLA picks TPU when no PJRT_DEVICE is set and a TPU is attached, and CPU
    otherwise; this mirrors that choice from the environment and the PCI bus.
    """
    explicit = (os.environ if environ is None else environ).get("PJRT_DEVICE")
    if explicit:
        return explicit.upper()
    return "TPU" if count_tpu_chips() > 0 else "CPU"


def local_device_count(environ=None):
    """Devices on this host that DeepSpeed may start one rank each on.

    TPU: chips on the PCI bus (one process per chip, as PyTorch/XLA's own spawn does).
    PJRT CPU: the emulated device count: the launcher's local world size inside a
    worker, else DS_XLA_CPU_DEVICES, else 1. ValueError when that variable is not an integer.
    """
    environ = os.environ if environ is None else environ
    if device_type(environ) == "TPU":
        return count_tpu_chips()
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", CPU_DEVICES_ENV):
        value = environ.get(name)
        if value:
            return int(value)
    return 1
