"""Profiler ranges (range_push / range_pop): DeepSpeed wraps hot functions in
instrument_w_nvtx, pushing and popping a named range around every call, nested."""

import pytest
import torch

from assertions import assert_tensor

pytestmark = pytest.mark.area("interface")


def test_range_push(accel, xla_device):
    accel.range_push("outer")
    accel.range_push("inner")
    result = torch.ones(2, device=xla_device) + 1
    accel.range_pop()
    accel.range_pop()
    assert_tensor(result, "ones(2) + 1 inside nested range_push/range_pop", values=[2.0, 2.0])


def test_range_pop(accel):
    from deepspeed.utils.nvtx import instrument_w_nvtx

    @instrument_w_nvtx
    def instrumented(value):
        return value * 3

    assert instrumented(instrumented(2)) == 18, "a function wrapped by instrument_w_nvtx returned the wrong value"
