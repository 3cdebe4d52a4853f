"""Tensor type constructors (get_accelerator().FloatTensor and friends): DeepSpeed builds small
device tensors with them, e.g. FloatTensor([float(total_norm)]) and ByteTensor([overflow]) in
ZeRO, and then all-reduces them across ranks, so they must live on the XLA device."""

import pytest
import torch
from assertions import assert_tensor
from conformance_helpers import covering

pytestmark = pytest.mark.area("interface")

TENSOR_TYPES = {"FloatTensor": torch.float32, "HalfTensor": torch.float16, "BFloat16Tensor": torch.bfloat16,
                "DoubleTensor": torch.float64, "ByteTensor": torch.uint8, "IntTensor": torch.int32,
                "LongTensor": torch.int64}


@pytest.mark.parametrize("name, dtype", [covering(name, dtype) for name, dtype in TENSOR_TYPES.items()])
def test_tensor_type(accel, name, dtype, evidence):
    constructor = getattr(accel, name)
    from_data = constructor([1, 0, 1])
    evidence.update(device=str(from_data.device), dtype=str(from_data.dtype))
    assert_tensor(from_data, f"{name}([1, 0, 1])", device_type="xla", dtype=dtype, values=[1, 0, 1],
                  why="DeepSpeed all-reduces these on the accelerator, so they must be XLA tensors of their type")
    # Information only: DeepSpeed always passes data; the sized form (torch.cuda.FloatTensor(2, 3)) is
    # the candidate's choice, and CUDA's own accelerator (a partial of torch.tensor) has none.
    try:
        evidence["sized_form_(2, 3)"] = str(tuple(constructor(2, 3).shape))
    except (TypeError, RuntimeError) as err:
        evidence["sized_form_(2, 3)"] = f"{type(err).__name__}: {err}"
