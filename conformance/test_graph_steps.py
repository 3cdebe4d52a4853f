"""A DeepSpeed training step on XLA: compiled once, then replayed from XLA's graph cache, and run
as few graphs and host transfers as the loop a PyTorch/XLA user writes by hand.

On XLA every distinct traced graph is a compilation (seconds to minutes on a TPU). An
accelerator that lets a per-step value leak into the graph as a constant (a step counter, a
learning rate, a host-side norm) recompiles every step: correct numbers, unusable speed. After
a warm-up (the first steps legitimately compile optimizer-state initialisation and the first
update), further steps must add no compilation.

Each graph execution and each device-to-host transfer is a round trip that a TPU step waits on.
The hand-written loop (same model, torch.optim.AdamW, one `torch_xla.sync()` per step, the
loss read back) sets the bound; DeepSpeed's own step reads some values on the host (its
overflow and gradient-norm checks), each one an execution and a transfer at most, listed per
config in STEP_ALLOWANCE with where they come from. An accelerator that adds a sync or a host
round trip per step fails with the counts.
"""

import argparse
import functools
import importlib.util
import os
from dataclasses import dataclass

import pytest
import torch
from xla_probe import graph_counters, sync

from harness.launching import single_rank_env
from harness.paths import FIXTURES

pytestmark = pytest.mark.area("graph")

WARMUP_STEPS, MEASURED_STEPS = 3, 4
CONFIGS = ["zero0", "zero1", "zero2", "zero3", "zero2_bf16"]


@dataclass(frozen=True)
class Allowance:
    """Per-step graph executions and transfers a DeepSpeed step may add to the hand loop's."""
    executions: int
    transfers: int
    why: str


_NORM_CHECKS = ("ZeRO's step reads the global gradient norm on the host twice (the overflow check, "
                "then the clipping check: `is_invalid_grad_norm` in stage_1_and_2.py)")
STEP_ALLOWANCE = {
    "zero0": Allowance(0, 0, "DeepSpeed's fp32 step without ZeRO reads nothing on the host"),
    "zero1": Allowance(2, 2, _NORM_CHECKS),
    "zero2": Allowance(2, 2, _NORM_CHECKS),
    "zero3": Allowance(2, 1, "ZeRO-3's step reads the gradient norm once (stage3.py), and its backward pass "
                       "ends in a graph cut of its own, before the step re-partitions the parameters"),
    "zero2_bf16": Allowance(3, 3, _NORM_CHECKS + ", and in bf16 it first checks the gradients themselves for "
                            "inf/NaN (`check_overflow`, one more read)"),
}


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


def _per_step(step, batches):
    """Run `step(x, y)` on each batch; the cumulative graph counters after each step."""
    counters = []
    for x, y in batches:
        step(x, y)
        counters.append(graph_counters())
    return counters


def _measured_delta(counters, key):
    """Mean per-step increase of counter `key` over the steps after warm-up."""
    return (counters[-1][key] - counters[WARMUP_STEPS - 1][key]) / MEASURED_STEPS


@functools.cache
def _deepspeed_steps(config, train_fixture):
    import deepspeed
    torch.manual_seed(42)
    model = train_fixture.MLP()
    args = argparse.Namespace(deepspeed_config=str(FIXTURES / "configs" / f"{config}.json"), local_rank=0)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32

    def step(x, y):
        loss = engine(x.to(engine.device, dtype), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        loss.item()  # the value a training loop logs

    sync()
    counters = _per_step(step, _batches(train_fixture, engine.train_micro_batch_size_per_gpu()))
    engine.destroy()
    return counters, dtype, engine.train_micro_batch_size_per_gpu()


@functools.cache
def _hand_loop_steps(dtype, micro_batch, train_fixture):
    """The loop a PyTorch/XLA user writes: forward, backward, AdamW, one sync, the loss read back."""
    device = torch.device("xla", 0)
    torch.manual_seed(42)
    model = train_fixture.MLP().to(device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)

    def step(x, y):
        loss = model(x.to(device, dtype), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sync()
        loss.item()

    sync()
    return _per_step(step, _batches(train_fixture, micro_batch))


def _batches(train_fixture, micro_batch):
    return train_fixture.batches(0, WARMUP_STEPS + MEASURED_STEPS, micro_batch, 1)


@pytest.mark.parametrize("config", CONFIGS)
def test_training_step_stops_compiling_after_warmup(config, train_fixture, evidence):
    counters, _, _ = _deepspeed_steps(config, train_fixture)
    per_step = [c["compilations"] for c in counters]
    added = per_step[-1] - per_step[WARMUP_STEPS - 1]
    evidence.update(config=config, compilations_after_each_step=per_step, warmup_steps=WARMUP_STEPS,
                    compilations_after_warmup=added)
    assert added == 0, (f"{config}: {added} new XLA compilations in the {MEASURED_STEPS} steps after warm-up "
                        f"(cumulative count per step {per_step}): a per-step value is being traced into the graph "
                        "(as a constant or a shape)")


@pytest.mark.parametrize("config", CONFIGS)
def test_training_step_runs_as_few_graphs_as_a_hand_loop(config, train_fixture, evidence):
    counters, dtype, micro_batch = _deepspeed_steps(config, train_fixture)
    hand = _hand_loop_steps(dtype, micro_batch, train_fixture)
    allowance = STEP_ALLOWANCE[config]
    measured = {key: (_measured_delta(counters, key), _measured_delta(hand, key)) for key in ("executions", "transfers")}
    bounds = {"executions": allowance.executions, "transfers": allowance.transfers}
    evidence.update(config=config, steps_measured=MEASURED_STEPS, allowance_why=allowance.why,
                    **{f"{key}_per_step": {"deepspeed": ds, "hand_loop": own, "bound": own + bounds[key]}
                       for key, (ds, own) in measured.items()})
    over = [f"{ds:g} graph {key} per step, the hand loop {own:g}, bound {own + bounds[key]:g}"
            for key, (ds, own) in measured.items() if ds > own + bounds[key]]
    assert not over, (f"{config}: {'; '.join(over)} (allowed beyond the hand loop: {allowance.why}): "
                      f"something in the step syncs or reads a device value on the host that DeepSpeed does not ask for")
