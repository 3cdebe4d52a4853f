"""Host-bridge transport: XLA tensors cross ranks through gloo on the host.

PJRT CPU has no cross-process collectives, so each rank (one OS process owning one
PJRT CPU device) copies its operands to host memory, runs the collective with gloo,
and writes the result back into the caller's XLA tensors in place. Device-side
semantics stay real XLA (lazy tensors, graph cuts at the copy, views); only the wire
is emulated. Every call completes before it returns: the work handle it gives back
is already done, which satisfies both sync and `async_op=True` callers.

What gloo lacks is built from what it has, with the exact torch.distributed result:
`ReduceOp.AVG` is a sum divided by the group size, reduce-scatter is an all-reduce
followed by taking this rank's shard.
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, ProcessGroup


def _done(result):
    future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


def _host(tensor):
    # .cpu() of an XLA tensor cuts the pending graph and transfers; CPU tensors pass
    # through untouched so gloo can work on them in place.
    return tensor if tensor.device.type == "cpu" else tensor.detach().cpu()


def _write_back(target, host):
    if target.device.type == "cpu" and target.data_ptr() == host.data_ptr():
        return
    with torch.no_grad():
        target.copy_(host.to(target.device))


class HostBridgeProcessGroup(ProcessGroup):

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.timeout = timeout

    def getBackendName(self):
        return "xla_ds"

    # -- reductions -------------------------------------------------------------------
    def _reduce_op(self, op):
        if op == dist.ReduceOp.AVG:
            return dist.ReduceOp.SUM, True
        if op == dist.ReduceOp.PREMUL_SUM:
            raise NotImplementedError(f"rank {self.rank()}: ReduceOp.PREMUL_SUM is not supported by the XLA "
                                      "host bridge; scale the tensor and use ReduceOp.SUM")
        return op, False

    def _allreduce_host(self, hosts, op):
        gloo_op, average = self._reduce_op(op)
        opts = AllreduceOptions()
        opts.reduceOp = gloo_op
        self._gloo.allreduce(hosts, opts).wait()
        if average:
            for host in hosts:
                host.div_(self.size()) if host.is_floating_point() else host.floor_divide_(self.size())

    def allreduce(self, tensors, opts):
        hosts = [_host(t) for t in tensors]
        self._allreduce_host(hosts, opts.reduceOp)
        for tensor, host in zip(tensors, hosts):
            _write_back(tensor, host)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts):
        hosts = [_host(t) for t in tensors]
        flat = torch.cat([h.reshape(-1) for h in hosts])
        self._allreduce_host([flat], opts.reduceOp)
        offset = 0
        for tensor in tensors:
            _write_back(tensor, flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
        return _done(tensors)

    def reduce(self, tensors, opts):
        # gloo's reduce has no AVG; an all-reduce gives every rank the value and only
        # the root keeps it, as torch.distributed.reduce specifies.
        hosts = [_host(t) for t in tensors]
        self._allreduce_host(hosts, opts.reduceOp)
        if self.rank() == opts.rootRank:
            for tensor, host in zip(tensors, hosts):
                _write_back(tensor, host)
        return _done(tensors)

    def _reduce_scatter_into(self, output, inputs, op):
        flat = torch.cat([_host(t).reshape(-1) for t in inputs])
        self._allreduce_host([flat], op)
        shard = flat.numel() // self.size()
        _write_back(output, flat[self.rank() * shard:(self.rank() + 1) * shard].view_as(output))

    def reduce_scatter(self, output_tensors, input_tensors_list, opts):
        for output, inputs in zip(output_tensors, input_tensors_list):
            self._reduce_scatter_into(output, inputs, opts.reduceOp)
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        self._reduce_scatter_into(output, [input], opts.reduceOp)
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        for output, input in zip(outputs, inputs):
            self._reduce_scatter_into(output, [input], opts.reduceOp)
        return _done(outputs)

    # -- gathers and broadcasts -------------------------------------------------------
    def broadcast(self, tensors, opts):
        hosts = [_host(t) for t in tensors]
        self._gloo.broadcast(hosts, opts).wait()
        for tensor, host in zip(tensors, hosts):
            _write_back(tensor, host)
        return _done(tensors)

    def allgather(self, output_tensors_list, input_tensors, opts=None):
        for outputs, input in zip(output_tensors_list, input_tensors):
            host_outputs = [torch.empty_like(_host(input)) for _ in outputs]
            self._gloo.allgather([host_outputs], [_host(input)]).wait()
            for output, host in zip(outputs, host_outputs):
                _write_back(output, host)
        return _done([t for outputs in output_tensors_list for t in outputs])

    def _gather_flat(self, input):
        host_input = _host(input).contiguous()
        host_outputs = [torch.empty_like(host_input) for _ in range(self.size())]
        self._gloo.allgather([host_outputs], [host_input]).wait()
        return torch.cat([h.reshape(-1) for h in host_outputs])

    def _allgather_base(self, output, input, opts=None):
        _write_back(output, self._gather_flat(input).view_as(output))
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            _write_back(output, self._gather_flat(input).view_as(output))
        return _done(outputs)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def gather(self, output_tensors_list, input_tensors, opts):
        # Everyone gathers (gloo's gather needs host buffers on the root only); the
        # root keeps the result.
        host_outputs = [torch.empty_like(_host(input_tensors[0])) for _ in range(self.size())]
        self._gloo.allgather([host_outputs], [_host(input_tensors[0])]).wait()
        if self.rank() == opts.rootRank:
            for output, host in zip(output_tensors_list[0], host_outputs):
                _write_back(output, host)
        return _done(output_tensors_list[0] if output_tensors_list else [])

    def scatter(self, output_tensors, input_tensors_list, opts):
        host_output = torch.empty_like(_host(output_tensors[0]))
        host_inputs = [[_host(t) for t in input_tensors_list[0]]] if input_tensors_list else []
        self._gloo.scatter([host_output], host_inputs, opts).wait()
        _write_back(output_tensors[0], host_output)
        return _done(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts):
        host_output = torch.empty_like(_host(output))
        self._gloo.alltoall_base(host_output, _host(input).contiguous(), output_split_sizes, input_split_sizes,
                                 opts).wait()
        _write_back(output, host_output)
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts):
        host_outputs = [torch.empty_like(_host(t)) for t in output_tensors]
        self._gloo.alltoall(host_outputs, [_host(t) for t in input_tensors], opts).wait()
        for output, host in zip(output_tensors, host_outputs):
            _write_back(output, host)
        return _done(output_tensors)

    # -- point to point and synchronisation -------------------------------------------
    def send(self, tensors, dst, tag):
        self._gloo.send([_host(t).contiguous() for t in tensors], dst, tag).wait()
        return _done(tensors)

    def recv(self, tensors, src, tag):
        hosts = [torch.empty_like(_host(t)) for t in tensors]
        self._gloo.recv(hosts, src, tag).wait()
        for tensor, host in zip(tensors, hosts):
            _write_back(tensor, host)
        return _done(tensors)

    def barrier(self, opts):
        # A real barrier, unlike the stock xla process group's no-op.
        self._gloo.barrier(opts).wait()
        return _done([])
