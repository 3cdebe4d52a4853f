"""The c10d ProcessGroup contract both transports of the `xla_ds` backend share.

The host bridge (bridge.py) and the XLA-native transport (native.py) differ in how tensors
cross ranks; what torch.distributed sees of them is the same: the backend name, the
group's global ranks, errors that name rank, group and operation, coalescing brackets,
and work handles that are complete when a collective returns.
"""

import torch
from torch._C._distributed_c10d import ProcessGroup

from . import BACKEND_NAME, CollectiveError


def completed_work(result):
    """A c10d Work already completed with `result`: wait(), is_completed() and get_future()
    return at once, which serves both sync and `async_op=True` callers."""
    future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


class XlaProcessGroupBase(ProcessGroup):
    """A c10d ProcessGroup of the `xla_ds` backend; subclasses implement the collectives.

    `rank` and `size` are group-relative, as c10d passes them; `global_ranks` lists the
    world rank of each group rank (default: the group is the world).
    """

    # Names the transport in "is not supported by the ..." errors.
    _transport: str

    def __init__(self, rank, size, timeout, global_ranks=None):
        super().__init__(rank, size)
        self.timeout = timeout
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))

    def getBackendName(self):
        """c10d ProcessGroup: the name the backend is registered under."""
        return BACKEND_NAME

    # c10d keeps a group's name in the backends registered on it, and a group of an extended-API backend such as
    # this one is its own backend, with none registered: `group.group_name` raised "ProcessGroup name not set",
    # and DeviceMesh.from_group (DeepSpeed's meshes, patches/device_mesh.py) reads it. The group keeps the name
    # torch.distributed gives it, which resolves back to it (`_resolve_process_group`).
    def _set_group_name(self, name):
        """c10d ProcessGroup: torch.distributed names the group when it registers it."""
        self._name = name

    @property
    def group_name(self):
        """The name torch.distributed registered this group under."""
        return self._name

    def _global_rank(self, group_rank):
        """The world rank of `group_rank` (c10d passes roots and peers relative to the group)."""
        return self._global_ranks[group_rank]

    def _where(self, op):
        """The 'deepspeed_xla[xla_ds] rank R in group [...]: op' prefix of every error of this group."""
        return f"deepspeed_xla[{BACKEND_NAME}] rank {self._global_rank(self.rank())} in group {self._global_ranks}: {op}"

    def _unsupported(self, op, why):
        return CollectiveError(f"{self._where(op)} is not supported by the {self._transport}: {why}")

    # torch's _coalescing_manager (DeepSpeed's all_gather_coalesced, ZeRO-3) brackets a
    # batch of collectives with these. Each collective here completes when called (host
    # bridge) or the graph batches it by itself (native), so there is nothing to batch: the
    # bracket only has to exist for XLA devices (without it torch raises after registering
    # the batch, and every later all_reduce of the group is silently queued instead of run).
    def _start_coalescing(self, device):
        """torch's _coalescing_manager: opens a batch; nothing to set up."""
        return None

    def _end_coalescing(self, device):
        """torch's _coalescing_manager: closes a batch with the Work it waits on (or hands
        back under async_ops), already complete."""
        return completed_work([])

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """c10d ProcessGroup: all_gather over several inputs, which `allgather` already takes."""
        return self.allgather(output_lists, input_tensors, opts)

    def recv_anysource(self, tensors, tag):
        """c10d ProcessGroup: recv(src=None), refused: both transports need the source rank named."""
        raise self._unsupported("recv(src=None)", "name the source rank")
