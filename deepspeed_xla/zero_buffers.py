"""ZeRO's gradient buffers on XLA: buckets no larger than the model, gradients not copied
into a preallocated buffer.

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
once DeepSpeed's engine module loads (engine_hooks.py); DeepSpeed's files are not touched.

Contiguous gradients. With `contiguous_gradients` (DeepSpeed's default) ZeRO-1/2 copy each
gradient into a preallocated flat bucket and hand it back as a view, "to prevent memory
fragmentation" of CUDA's caching allocator. XLA has no such allocator: the bucket is a value
that each copy replaces, the gradient views read earlier versions of it, and XLA copies the
whole bucket per gradient to keep those versions apart, a cost that grows with the bucket
times the gradients in it. The backward pass of a 4.2M-parameter MLP took 355 ms under ZeRO-1
and 708 ms under ZeRO-2 that way (PJRT CPU), against 42 and 33 ms without the option.
Without it DeepSpeed flattens each bucket's gradients in one concatenation and all-reduces
the bucket (`buffered_reduce_fallback`) instead of reducing each partition to its owner
(`average_tensor`): the same gradients summed and averaged by the world size, with more data
on the wire across ranks, and `gradient_predivide_factor`/`postscale_gradients` not applied
(with their defaults the result is the same). On XLA `zero_contiguous_gradients` reports False
for ZeRO-1/2 (ZeRO-3 buckets its gradients its own way, and measured no faster without it),
except with MoE layers, where ZeRO-2 requires the option (and ZeRO-1 has only been tested with
it); CPU offload turns it back on inside DeepSpeed, where the buffer is host memory.
"""

import functools

from xla_host.import_hooks import wrap_once

from .backend import DEVICE_TYPE

BUCKET_SIZE_ACCESSORS = ("zero_reduce_bucket_size", "zero_allgather_bucket_size", "zero_prefetch_bucket_size")


def model_numel(module):
    """Elements in `module`'s parameters, shared ones once (ZeRO-3 partitioned ones at full size)."""
    seen, total = set(), 0
    for param in module.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += getattr(param, "ds_numel", None) or param.numel()
    return total


def bounded(configured, numel):
    """`configured`, or the even number of elements just covering `numel` when that is smaller."""
    cap = numel + numel % 2
    return min(int(configured), max(cap, 2))


def _bound(accessor):

    @functools.wraps(accessor)
    def wrapper(engine):
        configured = accessor(engine)
        module = getattr(engine, "module", None)
        if module is None or not configured:
            return configured
        return bounded(configured, model_numel(module))

    return wrapper


def _flattened(accessor):

    @functools.wraps(accessor)
    def wrapper(engine):
        configured = accessor(engine)
        if (engine.device.type != DEVICE_TYPE or engine.zero_optimization_stage() not in (1, 2)
                or getattr(engine, "has_moe_layers", False)):
            return configured
        return False

    return wrapper


def install(engine_module):
    """Bound the bucket sizes and drop contiguous gradients on `engine_module.DeepSpeedEngine` (idempotent)."""
    engine = engine_module.DeepSpeedEngine
    for name in BUCKET_SIZE_ACCESSORS:
        if hasattr(engine, name):
            wrap_once(engine, name, _bound)
    wrap_once(engine, "zero_contiguous_gradients", _flattened)

