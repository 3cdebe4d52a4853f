"""Host-bridge transport: XLA tensors cross ranks through gloo on the host.

PJRT CPU has no cross-process collectives, so each rank (one OS process owning one
PJRT CPU device) copies its operands to host memory, runs the collective with gloo,
and writes the result back into the caller's tensors in place. Device-side semantics
stay real XLA (lazy tensors, the graph cut at each transfer, views); only the wire is
emulated.

Semantics kept exactly as torch.distributed specifies them:
* results land in the caller's tensors, including views of larger XLA tensors (the
  write goes through the view into its base) and outputs that alias the input (ZeRO-3
  gathers into a flat buffer whose shard is the input): every operand is read to the
  host before any result is written;
* before the operands are read, a callback the engine-step policy sets
  (`comm.set_before_operands_read`, patches/step_graphs.py) may cut the pending graph, so that inside
  DeepSpeed's backward pass what the rest of the step needs is computed once with them;
* every call completes before it returns; the work handle it gives back is already
  done, which satisfies both sync and `async_op=True` callers (wait(), is_completed(),
  get_future());
* subgroups from `new_group` are gloo groups over the same store;
* what gloo lacks is built from what it has: `ReduceOp.AVG` is a sum divided by the
  group size, reduce on the root and gather/scatter with XLA tensors go through the
  symmetric collectives;
* a group of one rank (a one-process run, DeepSpeed's data-parallel group of a model that is
  not data parallel) exchanges nothing: results are the inputs, written on the device, with
  no host round trip (each one would run the step's pending graph and copy it to the host).

Failures: each collective records, in the group's store, the sequence number and the
name of the last operation every rank entered. When gloo fails or times out
(DS_XLA_COLLECTIVE_TIMEOUT), the error names this rank, the operation, and where each
peer is: the rank that never arrived (or died) and what it was doing.
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions

from ..backend import runtime
from . import BACKEND_NAME, TIMEOUT_ENV, CollectiveError, arguments, before_operands_read
from .host_buffers import HostBufferPool
from .process_group import XlaProcessGroupBase, completed_work


def _cut_before_reading(operands):
    """Called once by each collective before it reads its operands with _host (once per collective: every further
    cut would be an empty sync, which still scans the live tensors and advances the RNG seed)."""
    if any(tensor.device.type != "cpu" for tensor in operands):
        before_operands_read()


# This process's staging buffers: operand copies and result buffers, reused across collectives.
_buffers = HostBufferPool()


def _host(tensor, read_only=False):
    """A contiguous host tensor with the value of `tensor`. CPU tensors that are already
    contiguous are used as they are, so gloo works on them in place. An XLA tensor's is a
    private copy in a staging buffer, or with read_only (an operand gloo only sends) possibly
    its device buffer itself (runtime.to_host), which must be dropped before the call returns."""
    if tensor.device.type == "cpu":
        return tensor if tensor.is_contiguous() else tensor.contiguous()
    with torch.no_grad():
        if read_only:
            return runtime.to_host(tensor, read_only=True)
        return runtime.to_host(tensor, out=_buffers.take(tensor.shape, tensor.dtype))


def _host_empty(tensor, numel=None):
    """An uninitialised host staging buffer of `tensor`'s shape (or `numel` elements, flat) and dtype."""
    return _buffers.take(tensor.shape if numel is None else (numel,), tensor.dtype)


def _host_flat(tensors):
    """The values of `tensors` (at least one, all of one dtype) flattened and concatenated in a host staging buffer."""
    flat = _host_empty(tensors[0], sum(t.numel() for t in tensors))
    return torch.cat([_host(t, read_only=True).reshape(-1) for t in tensors], out=flat)


def _write_back(target, host):
    """Write `host` into `target` in place."""
    if host is target:
        return
    with torch.no_grad():
        target.copy_(host if host.device == target.device else runtime.to_device(host, target.device))


def _reduce_op_name(op):
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if op == getattr(dist.ReduceOp, name):
            return name
    return str(op)


class _PendingWork(dist.Work):
    """A point-to-point transfer in flight; `wait()` completes it and lands the result."""

    def __init__(self, group, op, gloo_work, tensors, land=None):
        super().__init__()
        self._group, self._op, self._gloo_work = group, op, gloo_work
        self._tensors, self._land = tensors, land
        self._done = False

    def wait(self, timeout=None):
        if not self._done:
            self._group._wait(self._op, self._gloo_work)
            if self._land is not None:
                self._land()
            self._done = True
        return True

    def is_completed(self):
        return self._done

    def is_success(self):
        return self._done

    def get_future(self):
        self.wait()
        future = torch.futures.Future()
        future.set_result(self._tensors)
        return future


def _peer_state(peer_seq, peer_op, seq, op):
    """What a peer last entered (its collective number and op) against this rank's failed `op`, number `seq`."""
    if peer_seq != seq:
        return f"is at #{peer_seq} {peer_op}"
    if peer_op != op:
        return f"is at #{peer_seq} {peer_op}, where this rank called {op}"
    return "waits in the same call"


class HostBridgeProcessGroup(XlaProcessGroupBase):
    """The `xla_ds` process group on PJRT CPU: operands go to the host, through gloo (a ProcessGroupGloo over `store`) and
    back into the caller's XLA tensors in place; every collective has completed when it returns. `timeout` (a timedelta)
    bounds the rendezvous and each collective; a failure or timeout raises CollectiveError naming each peer's progress."""

    _transport = "XLA host bridge"

    def __init__(self, store, rank, size, timeout, global_ranks=None):
        super().__init__(rank, size, timeout, global_ranks)
        self._store = store
        self._seq = 0
        try:
            # Bounds the rendezvous with the other ranks of this group as well.
            store.set_timeout(timeout)
            self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        except RuntimeError as error:
            raise CollectiveError(
                f"{self._where('rendezvous')} failed: not every rank of the group connected within "
                f"{timeout.total_seconds():g}s (set {TIMEOUT_ENV} to change the limit): {error}") from error

    # -- failure reporting --------------------------------------------------------------
    def _enter(self, op):
        self._seq += 1
        try:
            self._store.set(f"{BACKEND_NAME}/progress/{self.rank()}", f"{self._seq}:{op}")
        except RuntimeError:
            pass  # the store went away with its host rank; the collective itself will say so

    def _peers(self, op):
        """Where every peer is, as far as the store still knows, for a failure of this rank's `op`:
        'rank 1 waits in the same call', or 'rank 1 is at #12 barrier' (with ', where this rank called
        all_reduce(op=SUM)' when that is the same position: the ranks called different collectives)."""
        lines = []
        for group_rank, global_rank in enumerate(self._global_ranks):
            if group_rank == self.rank():
                continue
            key = f"{BACKEND_NAME}/progress/{group_rank}"
            try:
                if not self._store.check([key]):
                    lines.append(f"rank {global_rank} entered no collective of this group")
                    continue
                seq, _, peer_op = self._store.get(key).decode().partition(":")
            except RuntimeError:
                return "the other ranks' progress is unknown (the store is unreachable: rank " \
                       f"{self._global_rank(0)}, which hosts it, may have exited)"
            lines.append(f"rank {global_rank} {_peer_state(int(seq), peer_op, self._seq, op)}")
        return "; ".join(lines)

    def _run(self, op, work_fn):
        """Run one gloo call (which returns a Work) to completion, naming rank and op on failure."""
        self._enter(op)
        self._wait(op, work_fn())

    def _wait(self, op, work):
        try:
            work.wait()
        except RuntimeError as error:
            raise CollectiveError(f"{self._where(op)} (#{self._seq}) failed: {error}. "
                                  f"Peers: {self._peers(op)}.") from error

    # -- reductions -------------------------------------------------------------------
    def _gloo_op(self, op, name):
        if op == dist.ReduceOp.AVG:
            return dist.ReduceOp.SUM, True
        if op == dist.ReduceOp.PREMUL_SUM:
            raise self._unsupported(f"{name}(op=PREMUL_SUM)", "scale the tensor and use ReduceOp.SUM")
        return op, False

    def _allreduce_host(self, hosts, op, name):
        gloo_op, average = self._gloo_op(op, name)
        opts = AllreduceOptions()
        opts.reduceOp = gloo_op
        self._run(f"{name}(op={_reduce_op_name(op)})", lambda: self._gloo.allreduce(hosts, opts))
        if average:
            for host in hosts:
                if host.is_floating_point() or host.is_complex():
                    host.div_(self.size())
                else:
                    host.floor_divide_(self.size())

    @property
    def reads_on_host(self):
        """Whether this group's collectives read XLA operands to the host: false in a group of one rank, which
        exchanges nothing."""
        return self.size() > 1

    def allreduce(self, tensors, opts):
        arguments.same_shape(self._where("all_reduce"), tensors, tensors[0])
        if not self.reads_on_host:
            self._gloo_op(opts.reduceOp, "all_reduce")  # refuses what it would refuse in a larger group
            return completed_work(tensors)
        _cut_before_reading(tensors)
        hosts = [_host(t) for t in tensors]
        self._allreduce_host(hosts, opts.reduceOp, "all_reduce")
        for tensor, host in zip(tensors, hosts):
            _write_back(tensor, host)
        return completed_work(tensors)

    def allreduce_coalesced(self, tensors, opts):
        if len({t.dtype for t in tensors}) > 1:
            raise self._unsupported("all_reduce_coalesced", "tensors of different dtypes in one call")
        if not self.reads_on_host:
            self._gloo_op(opts.reduceOp, "all_reduce_coalesced")
            return completed_work(tensors)
        _cut_before_reading(tensors)
        flat = _host_flat(tensors) if tensors else torch.empty(0, device="cpu")
        self._allreduce_host([flat], opts.reduceOp, "all_reduce_coalesced")
        offset = 0
        for tensor in tensors:
            _write_back(tensor, flat[offset:offset + tensor.numel()].view(tensor.shape))
            offset += tensor.numel()
        return completed_work(tensors)

    def reduce(self, tensors, opts):
        # gloo's reduce has no AVG; an all-reduce gives every rank the value and only
        # the root keeps it: torch.distributed.reduce leaves the others' tensors as they were.
        arguments.same_shape(self._where("reduce"), tensors, tensors[0])
        if not self.reads_on_host:
            self._gloo_op(opts.reduceOp, "reduce")
            return completed_work(tensors)
        _cut_before_reading(tensors)
        hosts = [_host(t).clone() if t.device.type == "cpu" else _host(t) for t in tensors]
        self._allreduce_host(hosts, opts.reduceOp, f"reduce(root={self._global_rank(opts.rootRank)})")
        if self.rank() == opts.rootRank:
            for tensor, host in zip(tensors, hosts):
                _write_back(tensor, host)
        return completed_work(tensors)

    def _reduce_scatter(self, outputs, inputs_per_output, op, name):
        if not self.reads_on_host:
            self._gloo_op(op, name)
            for output, inputs in zip(outputs, inputs_per_output):
                _write_back(output, torch.cat([t.reshape(-1) for t in inputs]).view(output.shape))
            return
        # All operands are read before any output is written (outputs may alias inputs).
        _cut_before_reading([t for inputs in inputs_per_output for t in inputs])
        flats = [_host(inputs[0]).reshape(-1) if len(inputs) == 1 and inputs[0].device.type != "cpu"
                 else _host_flat(inputs) for inputs in inputs_per_output]
        for output, flat in zip(outputs, flats):
            self._allreduce_host([flat], op, name)
            shard = output.numel()
            _write_back(output, flat[self.rank() * shard:(self.rank() + 1) * shard].view(output.shape))

    def reduce_scatter(self, output_tensors, input_tensors_list, opts):
        for output, inputs in zip(output_tensors, input_tensors_list):
            arguments.one_per_rank_like(self._where("reduce_scatter"), inputs, output, self.size(), "input list")
        self._reduce_scatter(output_tensors, input_tensors_list, opts.reduceOp, "reduce_scatter")
        return completed_work(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        arguments.flat_sizes(self._where("reduce_scatter_tensor"), input, output, self.size(), "input", "output")
        self._reduce_scatter([output], [[input]], opts.reduceOp, "reduce_scatter_tensor")
        return completed_work([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        for output, input in zip(outputs, inputs):
            arguments.flat_sizes(self._where("reduce_scatter_tensor_coalesced"), input, output, self.size(), "input",
                                 "output")
        self._reduce_scatter(outputs, [[t] for t in inputs], opts.reduceOp, "reduce_scatter_tensor_coalesced")
        return completed_work(outputs)

    # -- gathers and broadcasts -------------------------------------------------------
    def broadcast(self, tensors, opts):
        arguments.same_shape(self._where("broadcast"), tensors, tensors[0])
        if not self.reads_on_host:
            return completed_work(tensors)
        root = self.rank() == opts.rootRank
        # The root's buffers are only sent (gloo writes a root's other tensors when given several).
        if root:
            _cut_before_reading(tensors)
        hosts = [_host(t, read_only=len(tensors) == 1) if root else _host_empty(t) for t in tensors]
        self._run(f"broadcast(src={self._global_rank(opts.rootRank)})", lambda: self._gloo.broadcast(hosts, opts))
        if not root:
            for tensor, host in zip(tensors, hosts):
                _write_back(tensor, host)
        return completed_work(tensors)

    def _gather_hosts(self, input, name):
        """Every rank's value of `input`, in rank order, as one flat host tensor (an all-gather). The
        caller has cut before reading (_cut_before_reading)."""
        # gloo wants the input flat like the output: it compares the input's shape with each rank's chunk.
        host_input = _host(input, read_only=True).reshape(-1)
        flat = _host_empty(host_input, self.size() * host_input.numel())
        self._run(name, lambda: self._gloo._allgather_base(flat, host_input))
        return flat

    def allgather(self, output_tensors_list, input_tensors, opts=None):
        arguments.per_rank_lists(self._where("all_gather"), output_tensors_list, input_tensors, self.size())
        if not self.reads_on_host:
            for outputs, input in zip(output_tensors_list, input_tensors):
                _write_back(outputs[0], input)
            return completed_work([t for outputs in output_tensors_list for t in outputs])
        _cut_before_reading(input_tensors)
        gathered = [self._gather_hosts(input, "all_gather") for input in input_tensors]
        for outputs, flat in zip(output_tensors_list, gathered):
            for output, host in zip(outputs, flat.chunk(self.size())):
                _write_back(output, host.view(output.shape))
        return completed_work([t for outputs in output_tensors_list for t in outputs])

    def _gather_into(self, outputs, inputs, name):
        for output, input in zip(outputs, inputs):
            arguments.flat_sizes(self._where(name), output, input, self.size(), "output", "input")
        if not self.reads_on_host:
            for output, input in zip(outputs, inputs):
                _write_back(output, input.reshape(output.shape))
            return
        _cut_before_reading(inputs)
        gathered = [self._gather_hosts(input, name) for input in inputs]
        for output, flat in zip(outputs, gathered):
            _write_back(output, flat.view(output.shape))

    def _allgather_base(self, output, input, opts=None):
        self._gather_into([output], [input], "all_gather_into_tensor")
        return completed_work([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        self._gather_into(outputs, inputs, "all_gather_into_tensor_coalesced")
        return completed_work(outputs)

    def gather(self, output_tensors_list, input_tensors, opts):
        # Everyone gathers (gloo's gather needs host buffers on the root only); the
        # root keeps the result.
        name = f"gather(dst={self._global_rank(opts.rootRank)})"
        if self.rank() == opts.rootRank:
            arguments.per_rank_lists(self._where(name), output_tensors_list, input_tensors, self.size())
        _cut_before_reading(input_tensors[:1])
        flat = self._gather_hosts(input_tensors[0], name)
        if self.rank() == opts.rootRank:
            for output, host in zip(output_tensors_list[0], flat.chunk(self.size())):
                _write_back(output, host.view(output.shape))
        return completed_work(output_tensors_list[0] if output_tensors_list else [])

    def scatter(self, output_tensors, input_tensors_list, opts):
        if self.rank() == opts.rootRank:
            where = self._where(f"scatter(src={self._global_rank(opts.rootRank)})")
            arguments.one_per_rank_like(where, input_tensors_list[0], output_tensors[0], self.size(), "input list")
        host_output = _host_empty(output_tensors[0])
        _cut_before_reading(input_tensors_list[0] if input_tensors_list else [])
        host_inputs = [[_host(t, read_only=True) for t in input_tensors_list[0]]] if input_tensors_list else []
        self._run(f"scatter(src={self._global_rank(opts.rootRank)})",
                  lambda: self._gloo.scatter([host_output], host_inputs, opts))
        _write_back(output_tensors[0], host_output)
        return completed_work(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        arguments.all_to_all_single(self._where("all_to_all_single"), output, input, output_split_sizes,
                                    input_split_sizes, self.size())
        if not self.reads_on_host:
            arguments.flat_sizes(self._where("all_to_all_single"), output, input, 1, "output", "input")
            _write_back(output, input.reshape(output.shape))
            return completed_work([output])
        host_output = _host_empty(output)
        _cut_before_reading([input])
        host_input = _host(input, read_only=True)
        self._run("all_to_all_single", lambda: self._gloo.alltoall_base(host_output, host_input, output_split_sizes,
                                                                        input_split_sizes, opts))
        _write_back(output, host_output)
        return completed_work([output])

    def alltoall(self, output_tensors, input_tensors, opts):
        # gloo has only the single-tensor form: flatten, exchange with split sizes, unflatten.
        arguments.all_to_all(self._where("all_to_all"), output_tensors, input_tensors, self.size())
        if not self.reads_on_host:
            arguments.flat_sizes(self._where("all_to_all"), output_tensors[0], input_tensors[0], 1, "output", "input")
            _write_back(output_tensors[0], input_tensors[0].reshape(output_tensors[0].shape))
            return completed_work(output_tensors)
        _cut_before_reading(input_tensors)
        host_input = _host_flat(input_tensors)
        host_output = _host_empty(output_tensors[0], sum(t.numel() for t in output_tensors))
        out_splits, in_splits = [t.numel() for t in output_tensors], [t.numel() for t in input_tensors]
        self._run("all_to_all", lambda: self._gloo.alltoall_base(host_output, host_input, out_splits, in_splits, opts))
        for output, host in zip(output_tensors, torch.split(host_output, out_splits)):
            _write_back(output, host.view(output.shape))
        return completed_work(output_tensors)

    # -- point to point and synchronisation -------------------------------------------
    def send(self, tensors, dst, tag):
        # Point to point stays asynchronous (isend/irecv pairs may cross): the host copy
        # is taken now, the transfer completes when the caller waits.
        arguments.peer(self._where(f"send(dst=group rank {dst})"), dst, self.rank(), self.size())
        op = f"send(dst={self._global_rank(dst)})"
        _cut_before_reading(tensors)
        hosts = [_host(t) for t in tensors]
        self._enter(op)
        return _PendingWork(self, op, self._gloo.send(hosts, dst, tag), tensors)

    def recv(self, tensors, src, tag):
        arguments.peer(self._where(f"recv(src=group rank {src})"), src, self.rank(), self.size())
        op = f"recv(src={self._global_rank(src)})"
        hosts = [_host_empty(t) for t in tensors]
        self._enter(op)

        def land():
            for tensor, host in zip(tensors, hosts):
                _write_back(tensor, host)

        return _PendingWork(self, op, self._gloo.recv(hosts, src, tag), tensors, land)

    def barrier(self, opts):
        # A real barrier, unlike the stock xla process group's no-op.
        if not self.reads_on_host:
            return completed_work([])
        self._run("barrier", lambda: self._gloo.barrier(opts))
        return completed_work([])

    def monitored_barrier(self, opts, wait_all_ranks=False):
        self._run("monitored_barrier", lambda: self._gloo.barrier(dist.BarrierOptions()))
        return completed_work([])
