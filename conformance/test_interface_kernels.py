"""Kernel-path switches (is_triton_supported, prefer_triton_grouped_mm): DeepSpeed picks Triton
kernels when they claim support, so a claim must be backed by an importable Triton."""

import importlib.util

import pytest

pytestmark = pytest.mark.area("interface")


def test_is_triton_supported(accel):
    value = accel.is_triton_supported()
    assert isinstance(value, bool), f"is_triton_supported() returned {value!r}, expected a bool"
    if value:
        assert importlib.util.find_spec("triton") is not None, "is_triton_supported() but triton is not installed"


def test_prefer_triton_grouped_mm(accel):
    value = accel.prefer_triton_grouped_mm()
    assert isinstance(value, bool), f"prefer_triton_grouped_mm() returned {value!r}, expected a bool"
    assert not value or accel.is_triton_supported(), "prefer_triton_grouped_mm() without is_triton_supported()"
