"""Streams and events the way ZeRO and DeepSpeed's timers use them (DeepSpeedAccelerator
stream/event APIs): streams as context managers, wait_stream between streams, events
recorded on streams and queried, synchronized and timed."""

import pytest
import torch

from assertions import assert_tensor
from conformance_helpers import INDEX_FORMS, host

pytestmark = pytest.mark.area("interface")


def _check_stream(stream, label):
    for name in ("wait_stream", "wait_event", "synchronize", "query", "record_event"):
        assert callable(getattr(stream, name, None)), f"{label} has no {name}() (ZeRO calls it)"
    stream.synchronize()
    assert stream.query() is True, f"{label}.query() after synchronize() returned {stream.query()!r}, expected True"


def test_Stream(accel, xla_device):
    cls = accel.Stream
    if cls is None and accel.is_synchronized_device():
        pytest.skip("Stream is None: ZeRO constructs streams only where is_synchronized_device() is False")
    assert cls is not None, "Stream is None; ZeRO-1/2/3 construct get_accelerator().Stream() for communication"
    side = cls()
    _check_stream(side, "Stream()")
    _check_stream(cls(priority=0), "Stream(priority=0)")
    # stage_1_and_2: side.wait_stream(current); with stream(side): work; current.wait_stream(side)
    side.wait_stream(accel.current_stream())
    with accel.stream(side):
        tensor = torch.ones(4, device=xla_device) * 2
    accel.current_stream().wait_stream(side)
    assert_tensor(tensor, "ones(4) * 2 inside `with stream(Stream())`", values=[2.0] * 4)


def test_stream(accel, xla_device):
    side = accel.Stream()
    context = accel.stream(side)
    assert hasattr(context, "__enter__") and hasattr(context, "__exit__"), (
        f"stream(s) returned {context!r}, which is not a context manager")
    with context:
        tensor = torch.arange(3, device=xla_device) + 1
    assert_tensor(tensor, "arange(3) + 1 inside `with stream(s)`", values=[1, 2, 3])


@pytest.mark.parametrize("form", [None, *INDEX_FORMS])
def test_current_stream(accel, form):
    stream = accel.current_stream() if form is None else accel.current_stream(INDEX_FORMS[form](0))
    _check_stream(stream, f"current_stream({'' if form is None else form})")


@pytest.mark.parametrize("form", [None, *INDEX_FORMS])
def test_default_stream(accel, form):
    stream = accel.default_stream() if form is None else accel.default_stream(INDEX_FORMS[form](0))
    _check_stream(stream, f"default_stream({'' if form is None else form})")
    stream.wait_stream(accel.Stream())  # stage3: default_stream().wait_stream(reduce_and_partition_stream)


def test_Event(accel, xla_device, evidence):
    cls = accel.Event
    if cls is None and accel.is_synchronized_device() and accel.use_host_timers():
        pytest.skip("Event is None: ZeRO and DeepSpeed's timers construct events only where is_synchronized_device() "
                    "or use_host_timers() is False")
    assert cls is not None, "Event is None; ZeRO and DeepSpeed's timers construct get_accelerator().Event()"
    # ZeRO: event = Event(); event.record(stream); stream.wait_event(event); event.query()
    plain = cls()
    plain.record(accel.current_stream())
    accel.Stream().wait_event(plain)
    plain.synchronize()
    assert plain.query() is True, f"Event.query() after synchronize() returned {plain.query()!r}"
    # Timers: start = Event(enable_timing=True); start.record(); ... end.record(); start.elapsed_time(end)
    start, end = cls(enable_timing=True), cls(enable_timing=True)
    start.record()
    result = torch.randn(64, 64, device=xla_device) @ torch.randn(64, 64, device=xla_device)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    evidence["elapsed_ms"] = elapsed
    assert isinstance(elapsed, float) and elapsed >= 0.0, f"elapsed_time returned {elapsed!r}; expected ms >= 0"
    assert_tensor(host(result), "a 64x64 matmul between two recorded events", shape=(64, 64))


def test_use_host_timers__deepspeed_timer(accel, xla_device, evidence):
    """DeepSpeed's SynchronizedWallClockTimer chooses host timers or events by use_host_timers()."""
    from deepspeed.utils.timer import SynchronizedWallClockTimer

    timers = SynchronizedWallClockTimer()
    timer = timers("conformance")
    timer.start()
    result = torch.randn(128, 128, device=xla_device) @ torch.randn(128, 128, device=xla_device)
    host(result)
    timer.stop()
    elapsed = timer.elapsed(reset=True)
    evidence["elapsed_ms"] = elapsed
    assert elapsed > 0.0, f"a timer around device work measured {elapsed!r} ms"
