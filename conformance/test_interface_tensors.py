"""Tensor type constructors (get_accelerator().FloatTensor and friends): DeepSpeed builds small
device tensors with them, e.g. FloatTensor([float(total_norm)]) and ByteTensor([overflow]) in
ZeRO, and then all-reduces them across ranks, so they must live on the XLA device."""

import pytest
import torch

from conformance_helpers import host

pytestmark = pytest.mark.area("interface")


def _check_type(accel, name, dtype, evidence):
    constructor = getattr(accel, name)
    from_data = constructor([1, 0, 1])
    evidence.update(device=str(from_data.device), dtype=str(from_data.dtype))
    assert from_data.device.type == "xla", (f"{name}([1, 0, 1]) created a tensor on {from_data.device}; DeepSpeed "
                                            "all-reduces these on the accelerator, so they must be XLA tensors")
    assert from_data.dtype == dtype, f"{name}([1, 0, 1]) has dtype {from_data.dtype}, expected {dtype}"
    assert host(from_data).tolist() == [1, 0, 1], f"{name}([1, 0, 1]) holds {host(from_data).tolist()}"
    # Information only: DeepSpeed always passes data; the sized form (torch.cuda.FloatTensor(2, 3)) is
    # the candidate's choice, and CUDA's own accelerator (a partial of torch.tensor) has none.
    try:
        evidence["sized_form_(2, 3)"] = str(tuple(constructor(2, 3).shape))
    except (TypeError, RuntimeError) as err:
        evidence["sized_form_(2, 3)"] = f"{type(err).__name__}: {err}"


def test_FloatTensor(accel, evidence):
    _check_type(accel, "FloatTensor", torch.float32, evidence)


def test_HalfTensor(accel, evidence):
    _check_type(accel, "HalfTensor", torch.float16, evidence)


def test_BFloat16Tensor(accel, evidence):
    _check_type(accel, "BFloat16Tensor", torch.bfloat16, evidence)


def test_DoubleTensor(accel, evidence):
    _check_type(accel, "DoubleTensor", torch.float64, evidence)


def test_ByteTensor(accel, evidence):
    _check_type(accel, "ByteTensor", torch.uint8, evidence)


def test_IntTensor(accel, evidence):
    _check_type(accel, "IntTensor", torch.int32, evidence)


def test_LongTensor(accel, evidence):
    _check_type(accel, "LongTensor", torch.int64, evidence)
