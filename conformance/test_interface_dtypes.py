"""Data types the accelerator claims (DeepSpeedAccelerator data-type APIs): each claim must hold
on the device, and supported_dtypes() must agree with the is_*_supported answers."""

import pytest
import torch

from assertions import assert_tensor, returns_bool
from conformance_helpers import covering, host

pytestmark = pytest.mark.area("interface")


def _matmul_matches(dtype, xla_device, rtol):
    a = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    b = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    expected = a.to(dtype).float() @ b.to(dtype).float()
    result = host(a.to(dtype).to(xla_device) @ b.to(dtype).to(xla_device))
    assert_tensor(result, f"{dtype} matmul on the device", dtype=dtype)
    return torch.allclose(result.float(), expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("claim, dtype, rtol", [covering("is_bf16_supported", torch.bfloat16, 5e-2),
                                                covering("is_fp16_supported", torch.float16, 1e-2)])
def test_half_precision_claim(accel, xla_device, claim, dtype, rtol):
    if returns_bool(accel, claim):
        assert _matmul_matches(dtype, xla_device, rtol), f"{claim}() but {dtype} matmul on the device is wrong"


def test_is_fp64_supported(accel, xla_device):
    if returns_bool(accel, "is_fp64_supported"):
        value = host(torch.tensor([1.0], dtype=torch.float64, device=xla_device) + 1e-12)
        assert value.dtype == torch.float64 and value.item() != 1.0, (
            f"is_fp64_supported() but 1 + 1e-12 in float64 on the device gave {value.item()!r} ({value.dtype})")


def test_supported_dtypes(accel, xla_device):
    dtypes = accel.supported_dtypes()
    assert isinstance(dtypes, (list, tuple)) and all(isinstance(d, torch.dtype) for d in dtypes), (
        f"supported_dtypes() returned {dtypes!r}, expected a list of torch.dtype")
    assert torch.float32 in dtypes, f"supported_dtypes() {dtypes} lacks torch.float32"
    for dtype, claim in ((torch.bfloat16, "is_bf16_supported"), (torch.float16, "is_fp16_supported")):
        assert (dtype in dtypes) == getattr(accel, claim)(), (
            f"supported_dtypes() {'lists' if dtype in dtypes else 'omits'} {dtype} but {claim}() is "
            f"{getattr(accel, claim)()}")
    for dtype in dtypes:
        assert_tensor(torch.ones(2, dtype=dtype, device=xla_device) * 3, f"{dtype} arithmetic on the device (ones * 3)",
                      dtype=dtype, values=[3.0, 3.0], why="supported_dtypes() lists it")
