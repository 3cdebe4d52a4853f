"""Graph capture and compilation (DeepSpeedAccelerator graph and compile-backend APIs).

XLA traces and caches graphs itself, so an accelerator may either implement CUDA-graph-style
capture and replay or refuse it clearly (NotImplementedError with a reason) when DeepSpeed's
cuda_graph option asks for it; anything else (AttributeError, None objects failing later) is a
defect. The compile backend must be one torch.compile knows.
"""

import pytest
import torch

from assertions import assert_tensor

pytestmark = pytest.mark.area("interface")


def _graph_or_refusal(accel):
    """(graph, None) when capture is implemented, (None, refusal) when create_graph refuses clearly."""
    try:
        return accel.create_graph(), None
    except NotImplementedError as refusal:
        assert str(refusal).strip(), "create_graph() raised NotImplementedError without saying why"
        return None, refusal


def test_create_graph(accel):
    graph, refusal = _graph_or_refusal(accel)
    assert graph is not None or refusal is not None, "create_graph() returned None without refusing"


def _captured_doubling(accel, xla_device, method):
    """(graph, source, result) with `result = source * 2` captured into a graph, or None when the
    candidate refuses capture and `method` refuses it as clearly."""
    graph, refusal = _graph_or_refusal(accel)
    if refusal is not None:
        with pytest.raises(NotImplementedError, match=r"\w"):
            getattr(accel, method)(graph)
        return None
    source = torch.ones(3, device=xla_device)
    with accel.capture_to_graph(graph):
        result = source * 2
    return graph, source, result


def test_capture_to_graph(accel, xla_device):
    captured = _captured_doubling(accel, xla_device, "capture_to_graph")
    if captured is not None:
        assert_tensor(captured[2], "source * 2 captured into a graph", values=[2.0] * 3)


def test_replay_graph(accel, xla_device):
    captured = _captured_doubling(accel, xla_device, "replay_graph")
    if captured is not None:
        graph, source, result = captured
        source.fill_(4.0)
        accel.replay_graph(graph)
        assert_tensor(result, "replay_graph() after the captured source * 2 got source 4.0", values=[8.0] * 3,
                      why="replaying must recompute the captured work on the new inputs")


def test_is_current_stream_capturing(accel):
    value = accel.is_current_stream_capturing()
    assert value is False, f"is_current_stream_capturing() outside any capture returned {value!r}, expected False"


def test_get_compile_backend(accel):
    backend = accel.get_compile_backend()
    known = torch._dynamo.list_backends(exclude_tags=())
    assert backend in known, f"get_compile_backend() returned {backend!r}, which torch.compile does not know ({known})"


def test_set_compile_backend(accel):
    original = accel.get_compile_backend()
    try:
        accel.set_compile_backend("eager")
        assert accel.get_compile_backend() == "eager", "set_compile_backend('eager') did not take effect"
        with pytest.raises(ValueError):
            accel.set_compile_backend("no-such-backend")
    finally:
        accel.set_compile_backend(original)
    assert accel.get_compile_backend() == original
