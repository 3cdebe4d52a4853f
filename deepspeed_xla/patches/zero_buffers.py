"""ZeRO's gradient buffers on XLA: buckets no larger than the model, the gradient partition in parameter order.

Bucket sizes. DeepSpeed's ZeRO stages allocate their gradient buckets at the configured size
(`reduce_bucket_size`, default 5e8 elements: 2 GB in fp32, twice with `overlap_comm`)
and hand out gradients as views into them. On CUDA the caching allocator reserves that
memory, and on DeepSpeed's CPU accelerator `torch.empty` leaves the untouched pages
unmapped. On XLA a view is computed from its base, so the first gradient read
materialises the whole bucket, every version of it that one graph updates included:
a 2,000-parameter model ran out of 12 GB of host memory on PJRT CPU with DeepSpeed's
defaults, and the same buffers take device memory on a TPU.

A bucket larger than all of the model's parameters together is never filled past
their count, so on XLA the engine reports each bucket size as at most the model's
parameter count (rounded up to an even count, the alignment ZeRO asserts): the same
buckets are flushed at the same points and the numerics do not change, only the unused
tail is gone. `install()` does this by wrapping the engine's bucket-size accessors
(`zero_reduce_bucket_size`, `zero_allgather_bucket_size`, `zero_prefetch_bucket_size`)
once DeepSpeed's engine module loads; DeepSpeed's files are not touched.

Contiguous gradients (DeepSpeed's default) stay as configured: each gradient is copied into a
slice of the flat bucket, which XLA computes as one concatenation of the gradients once the
copies lower as concatenations rather than selects over the whole bucket (backend/op_fixes.py).

Gradient partition layout. With contiguous gradients ZeRO-1/2 copy each reduced gradient of this
rank's partition into one flat buffer (`grads_in_partition`) at the next free offset, so the buffer
holds the gradients in the order the backward pass reduced them (ZeRO-2: last layer first), and the
step reads them back in parameter order (`get_flat_partition`, then flattening for the optimizer).
On CUDA that is one more copy kernel. On XLA it was a pass of its own in the step's graph: a
concatenation of the buffer's slices in the other order, the whole partition read and written once
more before the optimizer's update (a 4.2M-parameter MLP, ZeRO-2, one rank: the step's graph 14.4-14.6
against 9.3-10.6 ms). On XLA each gradient is therefore copied to its parameter's offset in
parameter order (`install()` wraps `copy_grads_in_partition`): the step then reads the partition's
slices in the order they lie, which XLA folds into the buffer itself. The gradients' values, their
views (`param.grad`) and everything DeepSpeed computes from them are unchanged; only where each one
lies in the buffer moves.
"""

import functools

import torch

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE
from . import DEEPSPEED_ENGINE

BUCKET_SIZE_ACCESSORS = ("zero_reduce_bucket_size", "zero_allgather_bucket_size", "zero_prefetch_bucket_size")


def model_numel(module):
    """Elements in `module`'s parameters, shared ones once (ZeRO-3 partitioned ones at full size)."""
    seen, total = set(), 0
    for param in module.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += getattr(param, "ds_numel", None) or param.numel()
    return total


# ZeRO's bucket sizes must be multiples of this (stage_1_and_2's nccl_start_alignment_factor: 4 bytes of fp16)
ALIGNMENT = 2


def bounded(configured, numel):
    """`configured`, or the even number of elements just covering `numel` when that is smaller. A size DeepSpeed
    refuses (not a multiple of ALIGNMENT) is handed on as written, for DeepSpeed's own validation to name."""
    if int(configured) % ALIGNMENT:
        return configured
    cap = numel + numel % ALIGNMENT
    return min(int(configured), max(cap, ALIGNMENT))


def _bound(accessor):

    @functools.wraps(accessor)
    def wrapper(engine):
        configured = accessor(engine)
        module = getattr(engine, "module", None)
        if module is None or not configured:
            return configured
        return bounded(configured, model_numel(module))

    return wrapper


_OFFSETS = "_deepspeed_xla_grad_offsets"


def _parameter_order_offsets(optimizer):
    """{param_id: offset} of each parameter of this rank's partition laid out in parameter order (group by
    group, as DeepSpeed sizes the buffer), and the buffer's size; computed once (the partition is fixed)."""
    layout = getattr(optimizer, _OFFSETS, None)
    if layout is None:
        offsets, size = {}, 0
        for group in optimizer.params_in_partition:
            for param in group:
                offsets[optimizer.get_param_id(param)] = size
                size += param.numel()
        layout = (offsets, size)
        setattr(optimizer, _OFFSETS, layout)
    return layout


def _in_parameter_order(copy_grads_in_partition):
    """Wrap DeepSpeedZeroOptimizer.copy_grads_in_partition(param, group_idx) to put an XLA gradient at its
    parameter's offset of `grads_in_partition`; CPU offload and the bf16 compact buffer do not use it."""

    @functools.wraps(copy_grads_in_partition)
    def wrapper(optimizer, param, group_idx=None):
        if param.device.type == DEVICE_TYPE and not optimizer.cpu_offload:
            if group_idx is None:
                group_idx = optimizer._get_param_group_idx(param)
            if not optimizer._use_compact_grad_partition_buffer(group_idx):
                offsets, size = _parameter_order_offsets(optimizer)
                if optimizer.grads_in_partition is None:  # DeepSpeed's own allocation would restart at offset 0
                    optimizer.grads_in_partition = torch.empty(size, dtype=optimizer.dtype, device=param.device)
                optimizer.grads_in_partition_offset = offsets[optimizer.get_param_id(param)]
        return copy_grads_in_partition(optimizer, param, group_idx)

    return wrapper


def _patch(engine_module):
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    engine = engine_module.DeepSpeedEngine
    for name in BUCKET_SIZE_ACCESSORS:
        if hasattr(engine, name):
            wrap_once(engine, name, _bound)
    wrap_once(DeepSpeedZeroOptimizer, "copy_grads_in_partition", _in_parameter_order)


_HOOK = PostImportHook(DEEPSPEED_ENGINE, _patch)


def install():
    """Bound DeepSpeedEngine's bucket sizes, and lay ZeRO-1/2's gradient partition out in parameter order on XLA,
    once DeepSpeed's engine module loads (idempotent)."""
    arm(_HOOK)
