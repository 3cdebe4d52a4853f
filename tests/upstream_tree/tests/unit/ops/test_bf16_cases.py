"""bf16 cases gated by DeepSpeed's helper, as test_bf16.py's are: at collection (skipif) and inside a rank."""

import pytest
import torch
from deepspeed.accelerator import get_accelerator

from unit.common import DistributedTest
from unit.util import bf16_required_version_check


@pytest.mark.skipif(not bf16_required_version_check(), reason="DeepSpeed BFloat16 tests need CUDA")
def test_bf16_sum_at_collection():
    x = torch.ones(8, dtype=torch.bfloat16, device=get_accelerator().current_device_name())
    assert x.sum().item() == 8


class TestBf16InRank(DistributedTest):
    world_size = 1

    def test_bf16_product(self):
        if not bf16_required_version_check():
            pytest.skip("DeepSpeed BFloat16 tests need CUDA")
        x = torch.full((4, ), 3.0, dtype=torch.bfloat16, device=get_accelerator().current_device_name())
        assert (x * x).float().cpu().tolist() == [9.0] * 4
