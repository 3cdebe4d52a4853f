"""The synchronisation model DeepSpeed asks the accelerator about (is_synchronized_device,
use_host_timers, resolves_data_dependency, handles_memory_backpressure) and what each answer
commits the accelerator to at DeepSpeed's call sites."""

import pytest
import torch
from assertions import returns_bool

pytestmark = pytest.mark.area("interface")


def test_is_synchronized_device(accel, xla_device):
    if not returns_bool(accel, "is_synchronized_device"):
        # ZeRO then creates side streams and calls tensor.record_stream(current_stream()).
        tensor = torch.ones(2, device=xla_device)
        tensor.record_stream(accel.current_stream())


def test_use_host_timers(accel):
    if not returns_bool(accel, "use_host_timers"):
        start, end = accel.Event(enable_timing=True), accel.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
        assert start.elapsed_time(end) >= 0, "use_host_timers() is False, but Event timing does not work"


def test_resolves_data_dependency(accel, xla_device):
    if not returns_bool(accel, "resolves_data_dependency"):
        # ZeRO then records gradient buffers on the producing stream with an event.
        tensor = torch.ones(2, device=xla_device)
        tensor.record_stream(accel.current_stream())
        event = accel.Event()
        event.record(accel.current_stream())


def test_handles_memory_backpressure(accel):
    returns_bool(accel, "handles_memory_backpressure")
