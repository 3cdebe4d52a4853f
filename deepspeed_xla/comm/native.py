"""Native transport: the XLA device's own collectives (TPU, XLA GPU).

PyTorch/XLA's `xla` process group semantics, traced into the step graph through
runtime.py, with what DeepSpeed needs and the stock group lacks:
* ReduceOp.AVG (a sum scaled by 1/group size inside the all-reduce);
* a real barrier (a one-element all-reduce, then waiting for the device);
* allreduce_coalesced, coalescing brackets, reduce_scatter/all_gather over lists;
* subgroups: every op uses this group's global ranks as its replica group (the stock
  group ignores subgroups in several ops), and source/destination ranks given relative
  to the group are translated to global ranks.

XLA requires replica groups to cover every replica of the program. A subgroup's ranks
form one group; the other ranks are split into groups of the same size where they can
be (DeepSpeed's data/model/pipeline groups partition the world into equal groups), else
into singletons: those ranks do not run this group's collective, so only the shape of
their groups matters, not who they are grouped with.

Results are written into the caller's tensors (copy_ of the traced result, which keeps
views and aliasing outputs correct); the work handle is complete at once, because the
graph orders everything by data dependency. Point to point is a collective permute and
needs both ends to trace it in the same step (as the pipeline schedule does).
"""

import datetime

import torch
import torch.distributed as dist

from ..backend import runtime
from . import arguments
from .process_group import XlaProcessGroupBase, completed_work


def replica_groups(ranks, world_size):
    """Replica groups covering `world_size` replicas in which `ranks` is one group."""
    ranks = list(ranks)
    if sorted(ranks) == list(range(world_size)):
        return [ranks]
    rest = [r for r in range(world_size) if r not in ranks]
    size = len(ranks)
    if len(rest) % size == 0:
        return [ranks] + [rest[i:i + size] for i in range(0, len(rest), size)]
    return [ranks] + [[r] for r in rest]


def _write(target, value):
    with torch.no_grad():
        target.copy_(value.reshape(target.shape))


class XlaNativeProcessGroup(XlaProcessGroupBase):
    """The `xla_ds` process group on TPU / XLA GPU: PyTorch/XLA's `xla` group semantics traced into the step graph over
    `groups`, plus ReduceOp.AVG, a real barrier and coalesced ops. Results are copied into the caller's tensors and work
    is complete at once; what XLA cannot express (uneven all-to-all, BXOR, PREMUL_SUM) raises CollectiveError."""

    _transport = "XLA native transport"
    _REDUCE_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR")

    def __init__(self, rank, size, timeout=None, global_ranks=None, world_size=None):
        super().__init__(rank, size, timeout or datetime.timedelta(minutes=30), global_ranks)
        self._world_size = world_size

    @property
    def groups(self):
        world = self._world_size or (dist.get_world_size() if dist.is_initialized() else self.size())
        return replica_groups(self._global_ranks, max(world, max(self._global_ranks) + 1))

    def _kind(self, op, name):
        """(XLA reduction kind, scale) for a torch ReduceOp."""
        if op == dist.ReduceOp.AVG:
            return "SUM", 1.0 / self.size()
        for kind in self._REDUCE_NAMES:
            if op == getattr(dist.ReduceOp, kind):
                return kind, 1.0
        raise self._unsupported(f"{name}(op={op})", "use SUM, AVG, PRODUCT, MIN, MAX, BAND or BOR")

    # -- reductions ---------------------------------------------------------------------
    def allreduce(self, tensors, opts):
        arguments.same_shape(self._where("all_reduce"), tensors, tensors[0])
        kind, scale = self._kind(opts.reduceOp, "all_reduce")
        for tensor in tensors:
            _write(tensor, runtime.all_reduce(kind, tensor, self.groups, scale))
        return completed_work(tensors)

    def allreduce_coalesced(self, tensors, opts):
        kind, scale = self._kind(opts.reduceOp, "all_reduce_coalesced")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        reduced = runtime.all_reduce(kind, flat, self.groups, scale)
        offset = 0
        for tensor in tensors:
            _write(tensor, reduced[offset:offset + tensor.numel()])
            offset += tensor.numel()
        return completed_work(tensors)

    def reduce(self, tensors, opts):
        kind, scale = self._kind(opts.reduceOp, "reduce")
        for tensor in tensors:
            reduced = runtime.all_reduce(kind, tensor, self.groups, scale)
            if self.rank() == opts.rootRank:
                _write(tensor, reduced)
        return completed_work(tensors)

    def _reduce_scatter(self, output, flat_input, op, name):
        kind, scale = self._kind(op, name)
        arguments.flat_sizes(self._where(name), flat_input, output, self.size(), "input", "output")
        _write(output, runtime.reduce_scatter(kind, flat_input, self.size(), self.groups, scale))

    def reduce_scatter(self, output_tensors, input_tensors_list, opts):
        for output, inputs in zip(output_tensors, input_tensors_list):
            arguments.one_per_rank_like(self._where("reduce_scatter"), inputs, output, self.size(), "input list")
            self._reduce_scatter(output, torch.cat([t.reshape(-1) for t in inputs]), opts.reduceOp, "reduce_scatter")
        return completed_work(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        self._reduce_scatter(output, input.reshape(-1), opts.reduceOp, "reduce_scatter_tensor")
        return completed_work([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        for output, input in zip(outputs, inputs):
            self._reduce_scatter(output, input.reshape(-1), opts.reduceOp, "reduce_scatter_tensor_coalesced")
        return completed_work(outputs)

    # -- gathers, broadcasts, scatter ---------------------------------------------------
    def broadcast(self, tensors, opts):
        arguments.same_shape(self._where("broadcast"), tensors, tensors[0])
        # The root contributes its value, everyone else zeros: a sum is the root's value.
        for tensor in tensors:
            contribution = tensor if self.rank() == opts.rootRank else torch.zeros_like(tensor)
            _write(tensor, runtime.all_reduce("SUM", contribution, self.groups))
        return completed_work(tensors)

    def _gathered(self, input):
        return runtime.all_gather(input.reshape(1, -1), self.groups)  # [group size, numel]

    def allgather(self, output_tensors_list, input_tensors, opts=None):
        arguments.per_rank_lists(self._where("all_gather"), output_tensors_list, input_tensors, self.size())
        for outputs, input in zip(output_tensors_list, input_tensors):
            gathered = self._gathered(input)
            for i, output in enumerate(outputs):
                _write(output, gathered[i])
        return completed_work([t for outputs in output_tensors_list for t in outputs])

    def _allgather_base(self, output, input, opts=None):
        arguments.flat_sizes(self._where("all_gather_into_tensor"), output, input, self.size(), "output", "input")
        _write(output, self._gathered(input))
        return completed_work([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            arguments.flat_sizes(self._where("all_gather_into_tensor_coalesced"), output, input, self.size(), "output",
                                 "input")
        for output, input in zip(outputs, inputs):
            _write(output, self._gathered(input))
        return completed_work(outputs)

    def gather(self, output_tensors_list, input_tensors, opts):
        if self.rank() == opts.rootRank:
            arguments.per_rank_lists(self._where("gather"), output_tensors_list, input_tensors, self.size())
        gathered = self._gathered(input_tensors[0])
        if self.rank() == opts.rootRank:
            for i, output in enumerate(output_tensors_list[0]):
                _write(output, gathered[i])
        return completed_work(output_tensors_list[0] if output_tensors_list else [])

    def scatter(self, output_tensors, input_tensors_list, opts):
        # The root's list, summed with everyone else's zeros, then each rank's shard.
        output = output_tensors[0]
        if self.rank() == opts.rootRank:
            arguments.one_per_rank_like(self._where("scatter"), input_tensors_list[0], output, self.size(), "input list")
            stacked = torch.cat([t.reshape(-1) for t in input_tensors_list[0]])
        else:
            stacked = torch.zeros(output.numel() * self.size(), dtype=output.dtype, device=output.device)
        _write(output, runtime.reduce_scatter("SUM", stacked, self.size(), self.groups))
        return completed_work(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        arguments.all_to_all_single(self._where("all_to_all_single"), output, input, output_split_sizes,
                                    input_split_sizes, self.size())
        if output_split_sizes or input_split_sizes:
            even_in = input.shape[0] // self.size()
            even_out = output.shape[0] // self.size()
            if set(input_split_sizes or [even_in]) != {even_in} or set(output_split_sizes or [even_out]) != {even_out}:
                raise self._unsupported("all_to_all_single(uneven splits)", "XLA's all-to-all exchanges equal chunks")
        _write(output, runtime.all_to_all(input, self.size(), self.groups))
        return completed_work([output])

    def alltoall(self, output_tensors, input_tensors, opts):
        arguments.all_to_all(self._where("all_to_all"), output_tensors, input_tensors, self.size())
        if len({tuple(t.shape) for t in input_tensors}) > 1:
            raise self._unsupported("all_to_all(tensors of different shapes)", "XLA's all-to-all exchanges equal chunks")
        exchanged = runtime.all_to_all(torch.stack(input_tensors), self.size(), self.groups)
        for i, output in enumerate(output_tensors):
            _write(output, exchanged[i])
        return completed_work(output_tensors)

    # -- point to point and synchronisation ---------------------------------------------
    def send(self, tensors, dst, tag):
        arguments.peer(self._where("send"), dst, self.rank(), self.size())
        pair = [[self._global_rank(self.rank()), self._global_rank(dst)]]
        # The permute has no consumer on the sending side: keep its result alive through
        # a sync so that the graph containing it runs now, in step with the receiver's.
        sent = [runtime.collective_permute(tensor, pair) for tensor in tensors]
        runtime.sync(wait=False)
        del sent
        return completed_work(tensors)

    def recv(self, tensors, src, tag):
        arguments.peer(self._where("recv"), src, self.rank(), self.size())
        pair = [[self._global_rank(src), self._global_rank(self.rank())]]
        for tensor in tensors:
            _write(tensor, runtime.collective_permute(tensor, pair))
        runtime.sync(wait=False)
        return completed_work(tensors)

    def barrier(self, opts):
        token = runtime.all_reduce("SUM", torch.zeros(1, device=runtime.torch_device()), self.groups)
        runtime.sync(wait=True)  # runs the all-reduce (token is alive) and waits for it
        del token
        return completed_work([])

    def monitored_barrier(self, opts, wait_all_ranks=False):
        return self.barrier(opts)
