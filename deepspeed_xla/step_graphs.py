"""Where DeepSpeed's training step cuts its XLA graph: at the end of the optimizer step, and
before each value the engine reads on the host.

XLA runs the traced graph lazily, when a value is read (the loss a script logs, the gradient
-norm and overflow checks of DeepSpeed's ZeRO and mixed-precision optimizers) or at a sync. A
read runs only what that value needs and keeps none of the rest: the next read, and the sync
after it, run the shared part again. Under ZeRO-1/2 the first of the step's two norm checks
ran the whole backward pass, the second the norm again, and the sync at the step's end all of
it once more. CUDA runs each op once, as it is issued; the XLA equivalent is to cut the graph
where the engine needs a value, as PyTorch/XLA's own loops mark a step before reading one:
  - inside `engine.backward()` and `engine.step()` (and `_take_model_step`, the optimizer step
    that PipelineEngine.train_batch takes), a host read of an XLA scalar (`.item()`, `bool()`,
    `float()`: `aten::_local_scalar_dense`) on the engine's thread or in its backward pass (autograd
    runs XLA hooks on worker threads) first cuts the pending graph, so the value comes from the
    graph that computed everything traced so far, and nothing is computed twice; reads on other
    threads (an asynchronous logging closure) are left alone. Inside `engine.step()` after a
    backward pass whose gradient reduction began with a cut (below), a read computes only what it
    reads: nothing of the backward pass is pending, and a cut would write out what is (the `.grad`
    views of the reduced bucket, which the step frees unread: ZeRO-1 at 2 ranks 17 MB per step for a
    16 MB model; 113 against 116 ms per step);
  - inside `engine.backward()`, the host bridge (PJRT CPU's transport) cuts the pending graph the
    same way before it reads a collective's operands: pending there are the forward and backward
    passes, which each later read (the next gradient bucket, the norm check, the loss) would run
    again: ZeRO-2 at 2 ranks ran them three times per step (a 4.2M-parameter MLP on PJRT CPU: 139
    ms per step, 127 ms with the cut; bf16 ZeRO-1/2 about 390 ms, 220-240 with it). Inside `step()`
    the bridge reads only what the operand needs: pending there is the gradients' copy out of the
    reduced bucket, which the optimizer's graph fuses; a cut there (ZeRO-0's norm all-reduce) wrote
    the gradients out between two graphs and made the step 24 ms slower;
  - inside `engine.backward()`, where the data-parallel group's collectives read on the host, the
    pending graph is cut before DeepSpeed starts a gradient reduction (without ZeRO
    `buffered_allreduce_fallback`, ZeRO-1/2 `reduce_ipg_grads`, ZeRO-3 `__reduce_and_partition_ipg_grads`),
    and the reduction's own collectives then read only their operands. A cut at the collective's read
    came after the reduction had made its views of the bucket (each gradient, its partitions, the
    flattened operand's chunks), and every view alive at a cut is a graph output of its own: ZeRO-3's
    backward graph wrote about 134 MB per step for a 16 MB model, ZeRO-1 101 MB. Without ZeRO, in one
    graph with the backward pass, XLA CPU also lays each weight gradient out transposed and transposes
    it twice, for `.grad` and inside the concatenation; cut, the concatenation reads `.grad` as it is
    laid out (2 ranks, a 4.2M-parameter MLP: ZeRO-0 fp32 151 -> 121 ms per step, bf16 194 -> 161;
    ZeRO-1 fp32 121 -> 117, ZeRO-2 125 -> 117, ZeRO-3 153 -> 146; one more graph execution each);
  - before each of these cuts, each parameter's `.grad` that is a view of a buffer written since it was made
    (ZeRO-1/2 point `.grad` at the gradient's slice of the bucket as they copy it in) is brought up
    to date. A stale view holds the buffer as it was: the cut computed and wrote out that version too,
    in bf16 one more concatenation of the whole bucket per earlier gradient (2 ranks, bf16 ZeRO-1/2,
    a 4.2M-parameter MLP in one bucket: the graph before the all-reduce 120 -> 100 ms). So are the
    buckets themselves: written only through views, ZeRO-1/2's bucket (made with `torch.empty` each
    step) kept the empty value it was made with, and the cut wrote that out as well;
  - `engine.step()` ends with a sync (the engine cuts there only from its third step, and only
    through its throughput timer), and so does the optimizer step PipelineEngine.train_batch takes
    (`_take_model_step` outside `step()`). Without it a pipeline whose step reads nothing on the
    host (fp32 without ZeRO) left each update pending: the next step's graph held all the updates
    before it, one more compilation per step and each step slower (2 stages: 0.6 s, then 4.7 s by the
    eighth step);
  - under ZeRO-3, `engine.backward()` also ends with a sync: its step gathers and re-partitions
    parameters around the reads, and one backward-plus-step graph measured slower than two
    (255 against 166 ms per step for a 4.2M-parameter MLP on PJRT CPU).
  - the mixed-precision overflow check (`CheckOverflow.has_overflow_serial`, FP16_Optimizer's, which
    bf16 without ZeRO uses) asks each gradient in turn whether it holds inf or NaN, one host read
    and one graph execution per parameter tensor; on XLA the per-gradient answers are combined on
    the device and read once. The answer is the same: whether any gradient has inf or NaN.
  - the inf/NaN test of one gradient (`has_inf_or_nan`, which every overflow check calls) is, on XLA,
    whether all elements are finite: one reduction that XLA fuses with the test, where DeepSpeed's
    `amax` and `amin` ran two that XLA CPU lowers as windowed reductions (a 2-rank bf16 ZeRO-1
    partition of a 4.2M-parameter MLP: 3.9 against 0.7 ms). The answer is the same, and fused, the
    elementwise test allocates no mask (DeepSpeed's reason for reducing first).
  - ZeRO-1/2's step asks `is_invalid_grad_norm` twice about the same norm tensor (the overflow
    check in `step`, then the clipping check in `unscale_and_clip_grads`); on XLA the verdict is
    kept on the tensor for as long as the tensor is unchanged (its version counter), so the second
    question is answered without a second graph execution and transfer.
  - DeepSpeed puts some host values into a device tensor only to all-reduce them over a group and
    read them back (`CheckOverflow.has_overflow`: `ByteTensor([overflow])`; `get_flattened_grad_norm`:
    `FloatTensor([norm])`, the fp32 rounding included). Where no group takes part (no model
    parallelism, no MoE, gradients already all-reduced), on XLA the accelerator's tensor types make
    that tensor on the host: the same dtype, the same rounding, and no graph execution and transfer
    for a value the host already had (bf16 without ZeRO: 5 executions per step -> 3).
Reads outside the engine's calls (a script's own `loss.item()`) keep PyTorch/XLA's behaviour.
`install()` wraps the two methods of DeepSpeedEngine and the two checks once DeepSpeed's
engine module loads (engine_hooks.py); DeepSpeed's files are not touched.
"""

import functools
import sys
import threading

import torch

from xla_host.import_hooks import wrap_once

from . import comm
from .backend import DEVICE_TYPE, op_fixes, runtime

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
        if tensor is not None and torch._is_functional_tensor(tensor):  # ZeRO-3 has no bucket without contiguous_gradients
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


def _zero3(engine):
    return engine.zero_optimization_stage() == 3


def _always(engine):
    return True


def _outside_step(engine):
    # `_take_model_step` inside engine.step() leaves the sync to step(); PipelineEngine.train_batch calls it alone.
    return _in_engine_call == 1


def _finiteness_in_one_reduction(has_inf_or_nan):

    @functools.wraps(has_inf_or_nan)
    def wrapper(x):
        if x.device.type != DEVICE_TYPE or x.is_sparse or x.numel() == 0:
            return has_inf_or_nan(x)
        return torch.isfinite(x).all().logical_not()

    return wrapper


def _overflow_in_one_read(has_overflow_serial):

    @functools.wraps(has_overflow_serial)
    def wrapper(checker, params):
        params = list(params)  # DeepSpeed may pass a generator
        grads = [(i, p.grad.data) for i, p in enumerate(params) if p.grad is not None]
        if not grads or grads[0][1].device.type != DEVICE_TYPE:
            return has_overflow_serial(checker, params)
        flags = [checker._has_inf_or_nan(grad, i) for i, grad in grads]
        if not all(torch.is_tensor(flag) for flag in flags):  # a checker whose test answers on the host
            return any(map(bool, flags))
        return bool(torch.stack(flags).any())

    return wrapper


_round_trips = threading.local()  # .depth: how many host-value round trips this thread is inside


def scalars_stay_on_host():
    """Whether the accelerator's tensor types (`FloatTensor([x])`, ...) make host tensors now: inside one
    of DeepSpeed's host-value round trips that no collective takes part in, on this thread."""
    return getattr(_round_trips, "depth", 0) > 0


def _round_trip_on_host(exchanges):
    """Wrap a DeepSpeed function that puts a host value into a device tensor, all-reduces it where
    `exchanges(*args, **kwargs)` is true, and reads it back: where it is false, the tensor types
    make that tensor on the host for the call (see scalars_stay_on_host)."""

    def wrap(function):

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if exchanges(*args, **kwargs):
                return function(*args, **kwargs)
            _round_trips.depth = getattr(_round_trips, "depth", 0) + 1
            try:
                return function(*args, **kwargs)
            finally:
                _round_trips.depth -= 1

        return wrapper

    return wrap


def _overflow_is_exchanged(checker, params, has_moe_params=None):
    # CheckOverflow.has_overflow (DeepSpeed 0.19.8) all-reduces its flag exactly in these cases.
    engine = checker.deepspeed
    return bool((checker.has_moe_params if has_moe_params is None else has_moe_params) or checker.zero_reduce_scatter
                or checker.mpu is not None or (engine is not None and engine.enable_backward_allreduce is False))


def _norm_is_exchanged(parameters, norm_type=2, mpu=None, grad_norm_mask=None):
    # get_flattened_grad_norm all-reduces its norm over the model-parallel group only.
    return mpu is not None


_NORM_VERDICT = "_ds_xla_invalid_norm"  # (tensor version, verdict) kept on a norm tensor


def _norm_verdict_kept(is_invalid_grad_norm):

    @functools.wraps(is_invalid_grad_norm)
    def wrapper(norm):
        if not (torch.is_tensor(norm) and norm.device.type == DEVICE_TYPE):
            return is_invalid_grad_norm(norm)
        kept = getattr(norm, _NORM_VERDICT, None)
        if kept is not None and kept[0] == norm._version:
            return kept[1]
        verdict = is_invalid_grad_norm(norm)
        setattr(norm, _NORM_VERDICT, (norm._version, verdict))
        return verdict

    return wrapper


def _wrap_function(utils, name, wrap):
    # DeepSpeed's optimizers import these functions by name: rebind each wherever DeepSpeed already has.
    original = getattr(utils, name)
    wrap_once(utils, name, wrap)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("deepspeed.") and getattr(module, name, None) is original:
            setattr(module, name, getattr(utils, name))


def install(engine_module):
    """Cut DeepSpeedEngine's graphs before host reads in backward/step, before gradients are reduced
    through the host bridge, and after step; test gradients for inf/NaN in one reduction, read the overflow
    check's answer once per step, answer a norm's validity once, and keep host values that no collective needs
    on the host (idempotent)."""
    from deepspeed.runtime import utils
    wrap_once(utils.CheckOverflow, "has_overflow_serial", _overflow_in_one_read)
    wrap_once(utils.CheckOverflow, "has_overflow", _round_trip_on_host(_overflow_is_exchanged))
    _wrap_function(utils, "is_invalid_grad_norm", _norm_verdict_kept)
    _wrap_function(utils, "has_inf_or_nan", _finiteness_in_one_reduction)
    _wrap_function(utils, "get_flattened_grad_norm", _round_trip_on_host(_norm_is_exchanged))
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
