"""Host memory for transfers (DeepSpeedAccelerator pinning hooks). ZeRO offload stages optimizer
state in buffers from pin_memory/pin_empty and copies them to and from the device with
non_blocking=True; whatever "pinned" means on the device, those buffers must be host tensors of
the right shape and dtype, and the copies must carry the data."""

import pytest
import torch
from assertions import assert_tensor, returns_bool

pytestmark = pytest.mark.area("interface")


def _check_host_buffer(buffer, shape, dtype, what):
    assert_tensor(buffer, what, device_type="cpu", shape=shape, dtype=dtype,
                  why="ZeRO offload stages optimizer state in host buffers")


def test_pin_memory(accel, xla_device):
    source = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    pinned = accel.pin_memory(source)
    _check_host_buffer(pinned, (3, 4), torch.float32, "pin_memory(t)")
    assert torch.equal(pinned, source), "pin_memory(t) changed the values"
    _check_host_buffer(accel.pin_memory(source, make_copy=False), (3, 4), torch.float32, "pin_memory(t, make_copy=False)")
    _check_host_buffer(accel.pin_memory(source, make_copy=False, match_shape=False), (12, ), torch.float32,
                       "pin_memory(t, make_copy=False, match_shape=False)")
    # Offload round trip: host -> device -> host, non-blocking, as ZeRO-Offload copies.
    on_device = torch.empty(3, 4, device=xla_device)
    on_device.copy_(pinned, non_blocking=True)
    back = accel.pin_memory(torch.zeros(3, 4))
    back.copy_(on_device * 2, non_blocking=True)
    accel.synchronize()
    assert torch.equal(back, source * 2), "non-blocking copies through pinned buffers lost data"


def test_pin_empty(accel):
    _check_host_buffer(accel.pin_empty(2, 5, dtype=torch.bfloat16), (2, 5), torch.bfloat16, "pin_empty(2, 5)")
    _check_host_buffer(accel.pin_empty((4, ), dtype=torch.float32), (4, ), torch.float32, "pin_empty((4,))")
    with pytest.raises(ValueError):
        accel.pin_empty(2, dtype=torch.float32, device=accel.device_name(0))


def test_pin_empty_like(accel, xla_device):
    template = torch.zeros(3, 2, dtype=torch.bfloat16, device=xla_device)
    _check_host_buffer(accel.pin_empty_like(template), (3, 2), torch.bfloat16, "pin_empty_like(xla tensor)")
    _check_host_buffer(accel.pin_empty_like(template, dtype=torch.float32), (3, 2), torch.float32,
                       "pin_empty_like(t, dtype=float32)")


def test_is_pinned(accel):
    pinned = accel.pin_memory(torch.ones(4))
    returns_bool(accel, "is_pinned", pinned)
    assert returns_bool(accel, "is_pinned", torch.ones(4)) is False, "is_pinned() claims an ordinary pageable tensor is pinned"


def test_unpin_memory(accel):
    buffer = accel.pin_memory(torch.ones(4))
    accel.unpin_memory(buffer)  # ZeRO-3 releases offload buffers this way
    assert torch.equal(buffer, torch.ones(4)), "unpin_memory() changed the buffer's data"


def test_register_host_memory(accel):
    buffer = torch.zeros(1024, dtype=torch.uint8)
    if returns_bool(accel, "register_host_memory", buffer.data_ptr(), buffer.numel()):
        accel.unregister_host_memory(buffer.data_ptr())


def test_unregister_host_memory(accel):
    buffer = torch.zeros(1024, dtype=torch.uint8)
    if accel.register_host_memory(buffer.data_ptr(), buffer.numel()):
        accel.unregister_host_memory(buffer.data_ptr())
    else:
        assert accel.unregister_host_memory(buffer.data_ptr()) is None


def test_pin_memory_alignment(accel):
    alignment = accel.pin_memory_alignment()
    assert isinstance(alignment, int) and alignment >= 1 and alignment & (alignment - 1) == 0, (
        f"pin_memory_alignment() returned {alignment!r}, expected a power of two >= 1")
