"""ZeRO's gradient buckets on XLA: no larger than the model.

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

Contiguous gradients (DeepSpeed's default) stay as configured: each gradient is copied into a
slice of the flat bucket, which XLA computes as one concatenation of the gradients once the
copies lower as concatenations rather than selects over the whole bucket (backend/op_fixes.py).
"""

import functools

from xla_host.import_hooks import wrap_once

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


def install(engine_module):
    """Bound the bucket sizes of `engine_module.DeepSpeedEngine` (idempotent)."""
    engine = engine_module.DeepSpeedEngine
    for name in BUCKET_SIZE_ACCESSORS:
        if hasattr(engine, name):
            wrap_once(engine, name, _bound)

