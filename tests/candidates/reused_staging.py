"""The host bridge stages each all_reduce in one host buffer per shape and dtype, reused on every call
without asking whether a result still lives in it (the device adopted the buffer as the result). A
later all_reduce of the same shape then overwrites earlier results: a gradient bucket kept across
the next bucket's reduction, or a max kept across a min.

(The backend is registered under its own name so it lives beside deepspeed_xla's.)
"""

import torch
import torch.distributed as dist

from deepspeed_xla.accelerator import XLA_Accelerator
from deepspeed_xla.backend import runtime
from deepspeed_xla.comm import bridge, collective_timeout
from deepspeed_xla.comm.process_group import completed_work

BACKEND = "xla_reused_staging"


class _ReusedStagingGroup(bridge.HostBridgeProcessGroup):

    def __init__(self, *args):
        super().__init__(*args)
        self._staging = {}

    def allreduce(self, tensors, opts):
        if self._alone or any(t.device.type == "cpu" for t in tensors):
            return super().allreduce(tensors, opts)
        bridge._cut_before_reading(tensors)
        hosts = []
        for tensor in tensors:
            key = (tuple(tensor.shape), tensor.dtype)
            if key not in self._staging:
                self._staging[key] = torch.empty(tensor.shape, dtype=tensor.dtype)
            with torch.no_grad():
                hosts.append(runtime.to_host(tensor, out=self._staging[key]))
        self._allreduce_host(hosts, opts.reduceOp, "all_reduce")
        for tensor, host in zip(tensors, hosts):
            bridge._write_back(tensor, host)
        return completed_work(tensors)


def _create(options, backend_options=None):
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    return _ReusedStagingGroup(options.store, options.group_rank, options.group_size,
                               collective_timeout(options.timeout), ranks)


class ReusedStaging(XLA_Accelerator):

    def __init__(self):
        super().__init__()
        if BACKEND not in dist.Backend.backend_list:
            dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["xla", "cpu"])
        self._communication_backend_name = BACKEND
