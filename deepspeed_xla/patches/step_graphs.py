"""Where DeepSpeed's training step cuts its XLA graph: at the end of the optimizer step, and
before each value the engine reads on the host.

XLA runs the traced graph lazily, when a value is read (the loss a script logs, the gradient-norm
and overflow checks of DeepSpeed's ZeRO and mixed-precision optimizers) or at a sync. A read runs
only what that value needs and keeps none of the rest: the next read, and the sync after it, run
the shared part again. CUDA runs each op once, as it is issued; the XLA equivalent is to cut the
graph where the engine needs a value, as PyTorch/XLA's own loops mark a step before reading one:
  - inside `engine.backward()` and `engine.step()` (and `_take_model_step`, the optimizer step that
    PipelineEngine.train_batch takes), a host read of an XLA scalar (`aten::_local_scalar_dense`)
    on the engine's thread or in its backward pass first cuts the pending graph, so the value comes
    from the graph that computed everything traced so far; reads on other threads are left alone.
    Inside `step()` after a backward pass whose gradient reduction began with a cut, a read computes
    only what it reads: a cut would write out the `.grad` views the step frees unread;
  - inside `engine.backward()`, the host bridge (PJRT CPU's transport) cuts the pending graph before
    it reads a collective's operands (`comm.set_before_operands_read`): pending there are the
    forward and backward passes, which every later read would run again. Inside `step()` the bridge
    reads only what the operand needs, which the optimizer's graph fuses;
  - inside `engine.backward()`, where the data-parallel group's collectives read on the host, the
    pending graph is cut before DeepSpeed starts a gradient reduction, and the reduction's own
    collectives then read only their operands: every view of the bucket alive at a later cut would be
    a graph output of its own;
  - before each cut, each parameter's `.grad` that is a view of a buffer written since it was made,
    and ZeRO's buckets, are brought up to date: a stale view makes the cut compute and write out the
    buffer's earlier version too;
  - `engine.step()` ends with a sync, and so does the optimizer step PipelineEngine.train_batch
    takes: otherwise a step that reads nothing on the host leaves each update pending, and the next
    step's graph holds all the updates before it;
  - under ZeRO-3, `engine.backward()` also ends with a sync: one backward-plus-step graph, which
    gathers and re-partitions parameters around the reads, runs slower than two;
  - under ZeRO-3, where the host bridge reads, the step's graph is cut before the persistent parameters
    are gathered out of the partition buffer it updated, one collective per parameter: a read of each
    one's slice would compute the whole update again.
Reads outside the engine's calls (a script's own `loss.item()`) keep PyTorch/XLA's behaviour. The
measurements behind each cut: docs/step-graphs.md. The host reads the checks themselves make are
reduced in host_reads.py.
"""

import functools
import threading

import torch

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from .. import comm
from ..backend import DEVICE_TYPE, op_fixes, runtime
from . import DEEPSPEED_ENGINE

_in_engine_call = 0  # depth of engine.backward()/step() calls on this process's XLA device
_in_backward = 0  # how many of those are engine.backward()
_engine_thread = None  # the thread that made the outermost of those calls
_engine = None  # the engine of the outermost of those calls
_in_reduction = 0  # depth of gradient reductions that began with a cut (their reads take only their operands)
_backward_reduced = False  # the last engine.backward() reduced its gradients after a cut: none of it is pending


def _engine_reads_now():
    # The engine's own reads: on its thread, or in its backward pass (autograd runs XLA hooks on worker threads).
    return _in_engine_call and (threading.get_ident() == _engine_thread or torch._C._current_graph_task_id() != -1)


def _read_scalar(tensor):
    # torch_xla's own kernel is this transfer: only the cut before it is added.
    if _engine_reads_now() and not (_backward_reduced and not _in_backward):
        _cut()
    return tensor.cpu().item()


def _in_engine_backward():
    return _in_backward and _engine_reads_now()


def _cut():
    _refresh_gradient_views(_engine)
    runtime.sync(wait=False)


def cut_before_collective_read():
    """Called by the host bridge before it reads a collective's XLA operands to the host: inside
    engine.backward(), on the engine's thread or in its backward pass, and outside a gradient
    reduction that began with a cut, cut the pending graph first (see the module's docstring);
    anywhere else do nothing, and the read computes only the operand."""
    if not _in_reduction and _in_engine_backward():
        _cut()


def _cut_before_reduction(group_of):
    """Wrap a DeepSpeed method that reduces gradient buckets over the group `group_of(owner)`: where that
    group's collectives read on the host, cut the pending graph before it (inside engine.backward(),
    as cut_before_collective_read does), and let its collectives read only their operands."""

    def wrap(reduce):

        @functools.wraps(reduce)
        def wrapper(owner, *args, **kwargs):
            global _in_reduction, _backward_reduced
            if not (_in_engine_backward() and comm.reads_on_host(group_of(owner))):
                return reduce(owner, *args, **kwargs)
            _cut()
            _backward_reduced = True
            _in_reduction += 1
            try:
                return reduce(owner, *args, **kwargs)
            finally:
                _in_reduction -= 1

        return wrapper

    return wrap


def _refresh_gradient_views(engine):
    """Bring ZeRO's gradient buckets (the optimizer's `ipg_buckets`), and each parameter's `.grad` that is
    a view of a buffer written since, up to date, so that the graph cut next reads them out of the buffer's
    last version. A stale view would make that graph compute, and write out, the buffer as it was when the
    view was made; a bucket written only through views keeps the value it was made with (ZeRO-1/2 make
    it with `torch.empty` each step), and the graph would write that out too."""
    tensors = []
    for bucket in getattr(engine.optimizer, "ipg_buckets", {}).values():
        tensors += bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer]  # ZeRO-1/2: a list
    tensors += [param.grad for param in engine.module.parameters()]
    for tensor in tensors:
        # ZeRO-3 has no bucket without contiguous_gradients. A view already written out costs the cut nothing
        # while stale: refreshing it would make it an output again, at every cut, for every gradient before it.
        if tensor is not None and torch._is_functional_tensor(tensor) and runtime.is_pending(tensor):
            torch._sync(tensor)


def _reads_cut_the_graph(method, backward=False):

    @functools.wraps(method)
    def wrapper(engine, *args, **kwargs):
        global _in_engine_call, _in_backward, _engine_thread, _engine, _backward_reduced
        on_xla = engine.device.type == DEVICE_TYPE
        if on_xla and not _in_engine_call:
            _engine_thread, _engine = threading.get_ident(), engine
            _backward_reduced = _backward_reduced and not backward
        _in_engine_call += on_xla
        _in_backward += on_xla and backward
        try:
            return method(engine, *args, **kwargs)
        finally:
            _in_engine_call -= on_xla
            _in_backward -= on_xla and backward
            if not _in_engine_call:
                _engine = None

    return wrapper


def _ending_in_a_sync(when):

    def wrap(method):

        @functools.wraps(method)
        def wrapper(engine, *args, **kwargs):
            result = method(engine, *args, **kwargs)
            if engine.device.type == DEVICE_TYPE and when(engine):
                runtime.sync(wait=False)
            return result

        return wrapper

    return wrap


def _cut_before_gathering_persistent_parameters(post_step):
    """Wrap ZeRO-3's `_post_step`, which all-gathers the persistent parameters, one collective per parameter, each
    reading that parameter's partition: a view of the partition buffer (`lp_param_buffer`) the step has just updated.
    Where those collectives read on the host, each read computed the whole update again for its slice (a graph of
    every parameter's update, per parameter, each compiled anew: quadratic in the parameter count), and the sync
    ending the step computed it once more. The pending graph is cut first: the update runs once, and each read is a
    slice of the buffer it wrote."""

    @functools.wraps(post_step)
    def wrapper(optimizer, *args, **kwargs):
        buffer = getattr(optimizer, "lp_param_buffer", None)  # absent where parameters are offloaded to the host
        if (optimizer.persistent_parameters and buffer is not None and buffer.device.type == DEVICE_TYPE
                and comm.reads_on_host(optimizer.dp_process_group)):
            runtime.sync(wait=False)
        return post_step(optimizer, *args, **kwargs)

    return wrapper


def _zero3(engine):
    return engine.zero_optimization_stage() == 3


def _always(engine):
    return True


def _outside_step(engine):
    # `_take_model_step` inside engine.step() leaves the sync to step(); PipelineEngine.train_batch calls it alone.
    return _in_engine_call == 1


def _patch(engine_module):
    op_fixes.replace_xla_kernels({"_local_scalar_dense": _read_scalar})
    engine = engine_module.DeepSpeedEngine
    for name, when in (("backward", _zero3), ("step", _always)):
        wrap_once(engine, name, lambda method, name=name, when=when: _reads_cut_the_graph(_ending_in_a_sync(when)(method),
                                                                                           backward=name == "backward"))
    wrap_once(engine, "_take_model_step", lambda method: _reads_cut_the_graph(_ending_in_a_sync(_outside_step)(method)))
    wrap_once(engine, "buffered_allreduce_fallback", _cut_before_reduction(lambda engine: engine.seq_data_parallel_group))
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    for optimizer, name in ((DeepSpeedZeroOptimizer, "reduce_ipg_grads"),
                            (DeepSpeedZeroOptimizer_Stage3, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads")):
        wrap_once(optimizer, name, _cut_before_reduction(lambda optimizer: optimizer.dp_process_group))
    wrap_once(DeepSpeedZeroOptimizer_Stage3, "_post_step", _cut_before_gathering_persistent_parameters)
    comm.set_before_operands_read(cut_before_collective_read)


_HOOK = PostImportHook(DEEPSPEED_ENGINE, _patch)


def install():
    """Cut DeepSpeedEngine's graphs before host reads in backward/step, before gradients are reduced through the
    host bridge, and after step, once DeepSpeed's engine module loads (idempotent)."""
    arm(_HOOK)
