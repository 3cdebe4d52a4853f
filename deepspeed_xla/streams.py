"""Streams and events for a device without user streams.

XLA executes one lazily built graph per device, in program order: there is a single
queue and no way to run work beside it. A `Stream` here is therefore a handle on that
one queue. Ordering calls (`wait_stream`, `wait_event`, entering a stream context)
are satisfied by construction and do nothing; completion calls (`synchronize`,
`query`) cut the pending graph and wait for the device, because that is the only way
to know work is done. Events record a host timestamp after such a wait when timing is
enabled, so `elapsed_time` measures device work, not tracing time.
"""

from .backend import runtime


class Stream:
    """The device's single in-order queue, shaped like torch.cuda.Stream."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = device
        self.priority = priority

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __eq__(self, other):
        # Every handle names the same queue.
        return isinstance(other, Stream)

    def __hash__(self):
        return hash(Stream)

    def wait_stream(self, stream):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def synchronize(self):
        runtime.sync()

    def query(self):
        runtime.sync()
        return True


class Event:
    """A point in the device queue, shaped like torch.cuda.Event."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self._time = None

    def record(self, stream=None):
        if self.enable_timing:
            runtime.sync()
            self._time = runtime.now()

    def wait(self, stream=None):
        return None

    def query(self):
        runtime.sync()
        return True

    def synchronize(self):
        runtime.sync()

    def elapsed_time(self, end_event):
        """Milliseconds between this event and end_event, like torch.cuda.Event."""
        if self._time is None or end_event._time is None:
            raise RuntimeError("elapsed_time needs two events created with enable_timing=True and both recorded")
        return (end_event._time - self._time) * 1000.0
