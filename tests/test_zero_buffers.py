"""ZeRO's bucket sizes stay within the model on XLA (deepspeed_xla/patches/zero_buffers.py)."""

import textwrap

import pytest
from helpers import last_json, run_python

from deepspeed_xla.patches.zero_buffers import bounded
from harness.launching import single_rank_env


def test_zero_bucket_sizes_are_bounded_by_the_model():
    code = textwrap.dedent("""
        import json, torch, deepspeed
        model = torch.nn.Linear(10, 5)  # 55 parameters
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
            "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 2}})
        print(json.dumps({"reduce": engine.zero_reduce_bucket_size(), "allgather": engine.zero_allgather_bucket_size(),
                          "reduce_kept": engine.optimizer.reduce_bucket_size}))
    """)
    result = last_json(run_python(code, "xla", single_rank_env()))
    assert result == {"reduce": 56, "allgather": 56, "reduce_kept": 56}, result


@pytest.mark.parametrize("configured, numel, expected", [(500_000_000, 55, 56), (500_000_000, 2_000, 2_000),
                                                        (1_000, 2_000, 1_000), (10, 1, 2),
                                                        (1_001, 55, 1_001)])  # misaligned: DeepSpeed refuses it
def test_bounded(configured, numel, expected):
    assert bounded(configured, numel) == expected
