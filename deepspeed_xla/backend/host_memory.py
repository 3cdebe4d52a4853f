"""Host memory for PJRT CPU's device buffers: freed memory stays with the process.

PJRT CPU allocates every graph execution's output and temporary buffers with the C allocator
and frees them when their tensors die, so a training step allocates and frees its model-sized
buffers (parameters, gradients, optimizer states, ZeRO's flat buckets: 16 MB each for a
4.2M-parameter model in fp32) once per step. glibc returns such memory to the kernel as soon as
it is freed: a buffer over its mmap threshold (at most 32 MiB) is unmapped, and a thread arena's
heap that empties is trimmed or deleted. The next step faults the same pages in again, zeroed:
15,000 page faults per ZeRO-2 step of that model on PJRT CPU, and the step took 1.8x the
hand-written loop's against 1.3x with the memory kept. A TPU's device memory is the runtime's
own, so none of this applies there.

`keep_freed_memory()` tells glibc, before the runtime starts its threads, to serve every size from
one heap (`M_ARENA_MAX` 1, `M_MMAP_MAX` 0) and never to give freed memory back (`M_TRIM_THRESHOLD`
at its maximum): the process's resident size stays at its peak rather than following each step's
buffers. DS_XLA_CPU_MALLOC=system leaves glibc's own settings; another C library is left alone.
"""

import ctypes
import os

SETTING = "DS_XLA_CPU_MALLOC"  # "keep" (default) or "system"
# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8


def keep_freed_memory(environ=os.environ):
    """On PJRT CPU (PJRT_DEVICE=CPU) under glibc, keep freed memory in the process (module docstring).
    Returns whether glibc's settings were changed. ValueError for a DS_XLA_CPU_MALLOC other than
    "keep" or "system"."""
    choice = environ.get(SETTING) or "keep"  # set but empty: the default
    if choice not in ("keep", "system"):
        raise ValueError(f"{SETTING}={choice!r} is not one of 'keep' (PJRT CPU's freed buffers stay with the "
                         "process) or 'system' (glibc's own malloc settings)")
    if choice == "system" or environ.get("PJRT_DEVICE", "").upper() != "CPU":
        return False
    libc = ctypes.CDLL(None)  # the symbols the process already has, its C library's among them
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc
        return False
    return all(libc.mallopt(param, value) == 1
               for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1)))
