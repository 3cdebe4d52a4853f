"""The communication backend maps ReduceOp.AVG to SUM and forgets to divide (the stock `xla`
process group has no AVG; the shortcut a port takes). ZeRO's gradient averaging and
DeepSpeed's all_reduce(AVG) then return world-size times the mean.

(The backend is registered under its own name so it lives beside deepspeed_xla's.)
"""

import torch.distributed as dist

from deepspeed_xla.accelerator import XLA_Accelerator
from deepspeed_xla.comm import collective_timeout
from deepspeed_xla.comm.bridge import HostBridgeProcessGroup

BACKEND = "xla_avg_as_sum"


class _AvgAsSumGroup(HostBridgeProcessGroup):

    def _gloo_op(self, op, name):
        return (dist.ReduceOp.SUM, False) if op == dist.ReduceOp.AVG else super()._gloo_op(op, name)


def _create(options, backend_options=None):
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    return _AvgAsSumGroup(options.store, options.group_rank, options.group_size, collective_timeout(options.timeout),
                          ranks)


class AvgAsSum(XLA_Accelerator):

    def __init__(self):
        super().__init__()
        if BACKEND not in dist.Backend.backend_list:
            dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["xla", "cpu"])
        self._communication_backend_name = BACKEND
