"""The torch.distributed backend DeepSpeed uses on XLA devices.

One backend name, two transports, chosen per process by the XLA device kind:

* PJRT CPU (emulation): the host bridge (bridge.py). Each rank is an OS process
  owning one PJRT CPU device; tensors cross ranks through gloo on the host, because
  PJRT CPU has no cross-process collectives.
* TPU and other XLA hardware: the device's own collectives (native.py), i.e.
  PyTorch/XLA's `xla` process-group semantics, completed where DeepSpeed needs more
  (ReduceOp.AVG, a real barrier, allreduce_coalesced, subgroup-correct replica groups).

Both subclass one c10d ProcessGroup (process_group.py) holding what they share, and are
registered with torch.distributed the standard way, so DeepSpeed's
`init_distributed` picks them up through `communication_backend_name()` unchanged.
The device kind comes from `xla_host.discovery.device_type()`, which reads the environment and
the PCI bus only: choosing a transport never starts the XLA runtime.

Failures name the rank and the operation (`CollectiveError`). A rank that waits for a
peer gives up after DS_XLA_COLLECTIVE_TIMEOUT seconds (default: the process group's
own timeout, DeepSpeed's DEEPSPEED_TIMEOUT minutes), rendezvous included.
"""

import datetime
import os

import torch.distributed as dist

BACKEND_NAME = "xla_ds"
TIMEOUT_ENV = "DS_XLA_COLLECTIVE_TIMEOUT"
TRANSPORT_ENV = "DS_XLA_COMM_TRANSPORT"  # "bridge" or "native": overrides the choice by device kind

BRIDGE = "bridge"
NATIVE = "native"


class CollectiveError(RuntimeError):
    """A collective that failed, timed out or is not supported, naming rank and op."""


def transport_for(device_kind, environ=None):
    """`BRIDGE` on PJRT CPU, `NATIVE` on TPU/GPU, unless DS_XLA_COMM_TRANSPORT says otherwise."""
    environ = os.environ if environ is None else environ
    forced = environ.get(TRANSPORT_ENV, "").strip().lower()
    if forced:
        if forced not in (BRIDGE, NATIVE):
            raise ValueError(f"{TRANSPORT_ENV}={forced!r}: expected {BRIDGE!r} or {NATIVE!r}")
        return forced
    return BRIDGE if device_kind.upper() == "CPU" else NATIVE


def collective_timeout(default, environ=None):
    """The timeout for rendezvous and each collective: DS_XLA_COLLECTIVE_TIMEOUT seconds, else `default`."""
    environ = os.environ if environ is None else environ
    value = environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} must be a positive number of seconds")
    return datetime.timedelta(seconds=seconds)


def _create_process_group(options, backend_options=None):
    from xla_host import discovery
    # The groups default an empty global_ranks_in_group (the world group) to range(size).
    args = (options.group_rank, options.group_size, collective_timeout(options.timeout), options.global_ranks_in_group)
    if transport_for(discovery.device_type()) == BRIDGE:
        from .bridge import HostBridgeProcessGroup
        return HostBridgeProcessGroup(options.store, *args)
    from .native import XlaNativeProcessGroup
    return XlaNativeProcessGroup(*args)


def reads_on_host(group=None):
    """Whether a collective over `group` (a torch.distributed group; None: the world) reads its XLA
    operands to the host: the host bridge's, in a group of more than one rank. False where no
    process group is initialized."""
    if not dist.is_initialized():
        return False
    from .bridge import HostBridgeProcessGroup
    group = dist.group.WORLD if group is None else group
    return isinstance(group, HostBridgeProcessGroup) and group.reads_on_host


_before_operands_read = None  # set_before_operands_read's callback


def set_before_operands_read(callback):
    """Have `callback()` called once by each host-bridge collective, before it reads operands of which any is an XLA
    tensor to the host (None: nothing is called). The engine-step policy (patches/step_graphs.py) cuts the pending
    graph there inside engine.backward()."""
    global _before_operands_read
    _before_operands_read = callback


def before_operands_read():
    """Called by the host bridge before it reads XLA operands: runs set_before_operands_read's callback, if any."""
    if _before_operands_read is not None:
        _before_operands_read()


def register_backend():
    """Make `BACKEND_NAME` known to torch.distributed (idempotent)."""
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["xla", "cpu"])
