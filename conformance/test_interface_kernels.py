"""Kernel-path switches (is_triton_supported, prefer_triton_grouped_mm): DeepSpeed picks Triton
kernels when they claim support, so a claim must be backed by an importable Triton."""

import importlib.util

import pytest
from assertions import returns_bool

pytestmark = pytest.mark.area("interface")


def test_is_triton_supported(accel):
    if returns_bool(accel, "is_triton_supported"):
        assert importlib.util.find_spec("triton") is not None, "is_triton_supported() but triton is not installed"


def test_prefer_triton_grouped_mm(accel):
    value = returns_bool(accel, "prefer_triton_grouped_mm")
    assert not value or accel.is_triton_supported(), "prefer_triton_grouped_mm() without is_triton_supported()"
