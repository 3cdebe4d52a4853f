"""Host buffers the host bridge stages collectives in, handed out again once nothing holds them.

Every collective of the bridge copies its XLA operands into host buffers, runs gloo on them, and
copies the results to the device (runtime.to_device). A fresh buffer of a megabyte or more lands in pages the process
has not touched yet (torch allocates with posix_memalign, and glibc does not always serve such
blocks from memory freed earlier): a 16 MB all_reduce paid 4,096 page faults, 5 ms, on about a third of
its calls. The pool keeps a few such buffers and hands one out only while nothing else refers to
its memory: not a caller still holding it, and not gloo still sending from it.
"""

import math

import torch

# Smaller buffers come from the C allocator's free lists without page faults.
POOLED_BYTES = 1 << 20
# The most the kept buffers may add up to (what may stay allocated while no collective runs):
# several gradient buckets of 16-64 MB. Larger operands are staged in fresh buffers.
CAPACITY_BYTES = 256 << 20


def _bytes(buffer):
    return buffer.numel() * buffer.element_size()


def _unshared(buffer):
    """Whether `buffer` (the pool's own tensor) is the only reference to its memory: no view of it,
    and no other tensor shares its storage."""
    return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata) == 1


class HostBufferPool:
    """Contiguous CPU tensors for one process's collectives, reused by size and dtype.

    `take` returns a new view of a pooled buffer, which holds the buffer until the view (and
    anything made from it) is gone. Not thread-safe: collectives are issued from one thread.
    """

    def __init__(self, capacity_bytes=CAPACITY_BYTES, pooled_bytes=POOLED_BYTES):
        self._capacity_bytes, self._pooled_bytes = capacity_bytes, pooled_bytes
        self._buffers = []  # least recently taken first

    @property
    def kept_bytes(self):
        """What the kept buffers add up to, held or not (bytes)."""
        return sum(_bytes(buffer) for buffer in self._buffers)

    def take(self, shape, dtype):
        """An uninitialised contiguous CPU tensor of `shape` and `dtype`: a kept buffer that nothing
        holds where one of that size and dtype exists, else a new one, kept from then on if it is at
        least `pooled_bytes` and fits in `capacity_bytes` with the others (the least recently taken
        buffers that nothing holds are let go to make room)."""
        numel = math.prod(shape)
        for index, buffer in enumerate(self._buffers):
            if buffer.dtype == dtype and buffer.numel() == numel and _unshared(buffer):
                self._buffers.append(self._buffers.pop(index))
                return buffer.view(shape)
        # The device is named: inside DeepSpeed's zero.Init a bare constructor lands on the accelerator.
        buffer = torch.empty(numel, dtype=dtype, device="cpu")
        if _bytes(buffer) >= self._pooled_bytes and self._make_room(_bytes(buffer)):
            self._buffers.append(buffer)
        return buffer.view(shape)

    def _make_room(self, size):
        """Let go of free buffers, least recently taken first, until `size` more bytes fit; False
        (nothing let go) where they cannot."""
        kept = self.kept_bytes
        free = [buffer for buffer in self._buffers if _unshared(buffer)]
        if kept - sum(_bytes(buffer) for buffer in free) + size > self._capacity_bytes:
            return False
        let_go = set()
        for buffer in free:
            if kept + size <= self._capacity_bytes:
                break
            let_go.add(id(buffer))
            kept -= _bytes(buffer)
        # By identity: tensors compare element by element.
        self._buffers = [buffer for buffer in self._buffers if id(buffer) not in let_go]
        return True
