"""Memory accounting (DeepSpeedAccelerator memory APIs): integer byte counts that are consistent
with each other (peak >= current, reset brings the peak down, available <= total), usable from
DeepSpeed's see_memory_usage and ZeRO-3's allocator-retry warning."""

import pytest
import torch

from assertions import assert_tensor, returns_byte_count
from conformance_helpers import INDEX_FORMS, covering, materialise

pytestmark = pytest.mark.area("interface")

MiB = 1 << 20
SAMPLING_SLACK = MiB  # what sampled host figures may move between two reads, far below the 128 MiB spike


@pytest.fixture
def big_tensor(xla_device):
    """64 MiB materialised on the device while the check runs."""
    tensor = torch.ones(16 * MiB, device=xla_device)
    materialise()
    yield tensor
    del tensor


@pytest.mark.parametrize("form", [None, *INDEX_FORMS])
def test_memory_allocated(accel, form):
    returns_byte_count(accel, "memory_allocated", *(() if form is None else (INDEX_FORMS[form](0), )))


def test_memory_allocated__grows_with_tensors(accel, xla_device, evidence):
    # Large enough that memory freed by earlier checks cannot absorb it (host-backed devices
    # reuse freed buffers without growing).
    before = returns_byte_count(accel, "memory_allocated")
    tensor = torch.ones(64 * MiB, device=xla_device)  # 256 MiB
    materialise()
    after = returns_byte_count(accel, "memory_allocated")
    evidence.update(before=before, after_256MiB=after)
    assert after - before >= 64 * MiB, (f"memory_allocated grew by {(after - before) / MiB:.1f} MiB while a 256 MiB "
                                        "tensor was materialised on the device")
    del tensor


# peak figure -> the current figure it peaks
PEAKS = {"max_memory_allocated": "memory_allocated", "max_memory_cached": "memory_cached",
         "max_memory_reserved": "memory_reserved"}
# reset -> (the current figure, the peak it resets)
RESETS = {"reset_max_memory_allocated": ("memory_allocated", "max_memory_allocated"),
          "reset_max_memory_cached": ("memory_cached", "max_memory_cached"),
          "reset_peak_memory_stats": ("memory_allocated", "max_memory_allocated")}


@pytest.mark.parametrize("peak_method, current_method", [covering(peak, current) for peak, current in PEAKS.items()])
def test_peak_at_least_current(accel, big_tensor, peak_method, current_method):
    current = returns_byte_count(accel, current_method)
    peak = returns_byte_count(accel, peak_method)
    assert peak >= current, f"{peak_method}() = {peak} is below {current_method}() = {current}: a peak cannot be lower"


@pytest.mark.parametrize("reset_method, current_method, peak_method",
                         [covering(reset, *figures) for reset, figures in RESETS.items()])
def test_reset_brings_the_peak_down(accel, xla_device, reset_method, current_method, peak_method):
    spike = torch.ones(32 * MiB, device=xla_device)  # 128 MiB, then freed
    materialise()
    del spike
    peak_before = returns_byte_count(accel, peak_method)
    getattr(accel, reset_method)()
    # current first: a peak read later must cover it, even on a backend whose figures are
    # sampled (host RSS) and move with unrelated host allocations between two calls
    current = returns_byte_count(accel, current_method)
    peak_after = returns_byte_count(accel, peak_method)
    # Host-backed figures (RSS) gain a page or two between any two reads.
    assert peak_after <= peak_before + SAMPLING_SLACK, (
        f"{peak_method} rose from {peak_before} to {peak_after} across {reset_method}()")
    assert peak_after >= current, f"after {reset_method}(), {peak_method}() = {peak_after} < {current_method}() = {current}"


def test_memory_cached(accel, big_tensor):
    returns_byte_count(accel, "memory_cached")
    returns_byte_count(accel, "memory_cached", 0)


def test_memory_reserved(accel, big_tensor):
    reserved = returns_byte_count(accel, "memory_reserved")
    allocated = returns_byte_count(accel, "memory_allocated")
    assert reserved >= allocated * 0.9, (f"memory_reserved() = {reserved} is well below memory_allocated() = "
                                         f"{allocated}; reserved memory includes what is allocated")


def test_memory_stats(accel, big_tensor):
    stats = accel.memory_stats()
    assert isinstance(stats, dict), f"memory_stats() returned {type(stats).__name__}, expected a dict"
    bad = {k: v for k, v in stats.items() if not isinstance(v, (int, float))}
    assert not bad, f"memory_stats() has non-numeric values: {bad}"
    # ZeRO-3 reads memory_stats().get("num_alloc_retries") after every step.
    retries = stats.get("num_alloc_retries") or 0
    assert retries >= 0
    stats_by_index = accel.memory_stats(0)
    assert isinstance(stats_by_index, dict), "memory_stats(0) did not return a dict"


def test_total_memory(accel):
    total = returns_byte_count(accel, "total_memory")
    assert total > 0, "total_memory() is 0"
    assert returns_byte_count(accel, "total_memory", 0) == total, "total_memory(0) differs from total_memory()"


def test_available_memory(accel):
    available = returns_byte_count(accel, "available_memory")
    total = returns_byte_count(accel, "total_memory")
    assert 0 < available <= total, f"available_memory() = {available} is not within (0, total_memory() = {total}]"


def test_empty_cache(accel, xla_device):
    tensor = torch.arange(4, device=xla_device)
    result = accel.empty_cache()
    assert result is None, f"empty_cache() returned {result!r}"
    assert_tensor(tensor, "a live arange(4) after empty_cache()", values=[0, 1, 2, 3],
                  why="empty_cache() may release only unused memory")


def test_memory_allocated__see_memory_usage(accel):
    """DeepSpeed's see_memory_usage prints every memory figure and resets the peak."""
    from deepspeed.runtime.utils import see_memory_usage
    see_memory_usage("conformance", force=True)
