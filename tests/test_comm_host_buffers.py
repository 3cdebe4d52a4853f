"""The host bridge's staging buffers (comm/host_buffers.py): reused only once nothing holds them.

A buffer handed out again while a caller, gloo or an adopting device buffer still refers to it
would overwrite a collective's result; these tests hold it each of those ways, on a real PJRT
CPU device for the adoption.
"""

import torch
import torch_xla

from deepspeed_xla.backend import runtime
from deepspeed_xla.comm.host_buffers import HostBufferPool

XLA = torch_xla.device()
MIB = 1 << 20
BIG = MIB // 4  # fp32 elements: 1 MiB, the smallest size pooled
SMALL_POOL = dict(capacity_bytes=2 * MIB, pooled_bytes=MIB)  # room for two 1 MiB buffers


def test_a_released_buffer_is_handed_out_again():
    pool = HostBufferPool(**SMALL_POOL)
    first = pool.take((BIG, ), torch.float32)
    pointer = first.data_ptr()
    del first
    again = pool.take((2, BIG // 2), torch.float32)
    assert again.data_ptr() == pointer, "a buffer nothing holds should be reused, in the shape asked for"
    assert again.shape == (2, BIG // 2) and again.is_contiguous()


def test_a_held_buffer_or_a_view_of_it_is_not_handed_out():
    pool = HostBufferPool(**SMALL_POOL)
    held = pool.take((BIG, ), torch.float32)
    assert pool.take((BIG, ), torch.float32).data_ptr() != held.data_ptr()
    tail = held[BIG // 2:]
    pointer = held.data_ptr()
    del held
    assert pool.take((BIG, ), torch.float32).data_ptr() != pointer, "a view still refers to the buffer"
    del tail
    assert pool.take((BIG, ), torch.float32).data_ptr() == pointer


def test_a_buffer_copied_to_the_device_is_free_again_at_once():
    pool = HostBufferPool(**SMALL_POOL)
    host = pool.take((BIG, ), torch.float32)
    host.fill_(7.0)
    pointer = host.data_ptr()
    device = runtime.to_device(host, XLA)
    del host
    # The device holds a copy (runtime.to_device: XLA must never free memory a Python object owns).
    assert pool.take((BIG, ), torch.float32).data_ptr() == pointer
    assert torch.equal(device.cpu(), torch.full((BIG, ), 7.0))


def test_size_and_dtype_must_match():
    pool = HostBufferPool(capacity_bytes=4 * MIB, pooled_bytes=MIB)
    kept = pool.take((BIG, ), torch.float32)
    pointer = kept.data_ptr()
    del kept
    others = [pool.take((BIG, ), torch.int32), pool.take((BIG + 16, ), torch.float32)]
    assert all(other.data_ptr() != pointer for other in others)
    assert pool.take((BIG, ), torch.float32).data_ptr() == pointer


def test_small_buffers_are_not_kept():
    pool = HostBufferPool(**SMALL_POOL)
    pool.take((BIG // 2, ), torch.float32)
    assert pool.kept_bytes == 0
    pool.take((BIG, ), torch.float32)
    assert pool.kept_bytes == MIB


def test_a_full_pool_replaces_its_least_recently_taken_free_buffer():
    pool = HostBufferPool(**SMALL_POOL)
    pool.take((BIG, ), torch.float32)
    b_pointer = pool.take((BIG, ), torch.int32).data_ptr()
    c = pool.take((BIG // 2, ), torch.float64)  # full: the float32 buffer, taken longest ago and free, makes room
    assert pool.kept_bytes == 2 * MIB
    c_pointer = c.data_ptr()
    del c
    assert pool.take((BIG, ), torch.int32).data_ptr() == b_pointer
    assert pool.take((BIG // 2, ), torch.float64).data_ptr() == c_pointer


def test_room_is_made_behind_a_held_buffer():
    pool = HostBufferPool(capacity_bytes=3 * MIB, pooled_bytes=MIB)
    held = pool.take((BIG, ), torch.float32)
    pool.take((BIG, ), torch.int32)  # kept after the held buffer, free at once
    pointer = pool.take((2 * BIG, ), torch.float32).data_ptr()  # lets the free buffer go, not the held one
    assert pool.kept_bytes == 3 * MIB
    assert pool.take((2 * BIG, ), torch.float32).data_ptr() == pointer
    assert held.data_ptr() != pointer


def test_a_buffer_larger_than_the_pool_is_not_kept():
    pool = HostBufferPool(**SMALL_POOL)
    pool.take((BIG, ), torch.float32)
    pool.take((3 * BIG, ), torch.float32)
    assert pool.kept_bytes == MIB, "the free 1 MiB buffer stays: letting it go would not make room"


def test_a_full_pool_of_held_buffers_still_serves_buffers_it_does_not_keep():
    pool = HostBufferPool(**SMALL_POOL)
    held = [pool.take((BIG, ), torch.float32) for _ in range(2)]
    extra = pool.take((BIG, ), torch.float32)
    held_pointers = {h.data_ptr() for h in held}
    assert pool.kept_bytes == 2 * MIB and extra.data_ptr() not in held_pointers
    del held, extra
    assert {pool.take((BIG, ), torch.float32).data_ptr() for _ in range(2)} <= held_pointers, \
        "the held buffers were kept, not the extra one"
