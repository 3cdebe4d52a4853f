"""A DeepSpeed training step compiles once and is then replayed from XLA's graph cache.

On XLA every distinct traced graph is a compilation (seconds to minutes on a TPU). An
accelerator that lets a per-step value leak into the graph as a constant (a step
counter, a learning rate, a host-side norm) recompiles every step: correct numbers,
unusable speed. After a warm-up (the first steps legitimately compile optimizer-state
initialisation and the first update), further steps must add no compilation.
"""

import argparse
import importlib.util
import os

import pytest
import torch

from harness.training import FIXTURES, single_rank_env
from xla_probe import compilations

pytestmark = pytest.mark.area("graph")

WARMUP_STEPS, MEASURED_STEPS = 3, 4
CONFIGS = ["zero0", "zero1", "zero2", "zero3", "zero2_bf16"]


@pytest.fixture(scope="module")
def train_fixture():
    """fixtures/train.py as a module (its model and data), and a one-rank process group that
    is taken down afterwards (other checks in this process expect none)."""
    import deepspeed
    saved = dict(os.environ)
    os.environ.update(single_rank_env())
    deepspeed.init_distributed()
    spec = importlib.util.spec_from_file_location("train_fixture", FIXTURES / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    deepspeed.comm.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("config", CONFIGS)
def test_training_step_stops_compiling_after_warmup(config, train_fixture, evidence):
    import deepspeed
    torch.manual_seed(42)
    model = train_fixture.MLP()
    args = argparse.Namespace(deepspeed_config=str(FIXTURES / "configs" / f"{config}.json"), local_rank=0)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    per_step = []
    for x, y in train_fixture.batches(0, WARMUP_STEPS + MEASURED_STEPS, engine.train_micro_batch_size_per_gpu(), 1):
        loss = engine(x.to(engine.device, dtype), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        loss.item()  # the step a training loop logs: its graph runs here
        per_step.append(compilations())
    engine.destroy()
    added = per_step[-1] - per_step[WARMUP_STEPS - 1]
    evidence.update(config=config, compilations_after_each_step=per_step, warmup_steps=WARMUP_STEPS,
                    compilations_after_warmup=added)
    assert added == 0, (f"{config}: {added} new XLA compilations in the {MEASURED_STEPS} steps after warm-up "
                        f"(cumulative count per step {per_step}): a per-step value is being traced into the graph (as a constant or a shape)")
