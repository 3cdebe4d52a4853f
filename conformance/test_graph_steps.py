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
overflow and gradient-norm checks), each one an execution and a transfer at most: the `allowance`
of each case of the `graph` table of fixtures/training_cases.toml, with where they come from. An
accelerator that adds a sync or a host round trip per step fails with the counts.
"""

import argparse
import functools
import os
from dataclasses import dataclass

import pytest
import torch
from conformance_helpers import import_fixture_script, training_case_params
from xla_probe import graph_counters, sync

from harness.launching import single_rank_env
from harness.paths import FIXTURES

pytestmark = pytest.mark.area("graph")


@dataclass(frozen=True)
class Allowance:
    """Per-step graph executions and transfers a DeepSpeed step may add to the hand loop's."""
    executions: int
    transfers: int
    why: str


@pytest.fixture(scope="module")
def one_rank_group():
    """A one-rank process group for the engines these checks build, taken down afterwards (other
    checks in this process expect none)."""
    import deepspeed
    saved = dict(os.environ)
    os.environ.update(single_rank_env())
    deepspeed.init_distributed()
    yield
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


def _measured_delta(counters, key, case):
    """Mean per-step increase of counter `key` over the case's steps after warm-up."""
    warmup = case.area_fields["warmup_steps"]
    return (counters[-1][key] - counters[warmup - 1][key]) / (case.steps - warmup)


@functools.cache
def _deepspeed_steps(case):
    import deepspeed
    script = import_fixture_script(case.script)
    torch.manual_seed(42)
    model = script.MLP()
    args = argparse.Namespace(deepspeed_config=str(FIXTURES / case.config), local_rank=0)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32

    def step(x, y):
        loss = engine(x.to(engine.device, dtype), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        loss.item()  # the value a training loop logs

    sync()
    counters = _per_step(step, script.batches(0, case.steps, engine.train_micro_batch_size_per_gpu(), 1))
    engine.destroy()
    return counters, dtype, engine.train_micro_batch_size_per_gpu()


@functools.cache
def _hand_loop_steps(script_name, steps, dtype, micro_batch):
    """The loop a PyTorch/XLA user writes: forward, backward, AdamW, one sync, the loss read back."""
    script = import_fixture_script(script_name)
    device = torch.device("xla", 0)
    torch.manual_seed(42)
    model = script.MLP().to(device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)

    def step(x, y):
        loss = model(x.to(device, dtype), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sync()
        loss.item()

    sync()
    return _per_step(step, script.batches(0, steps, micro_batch, 1))


@pytest.mark.parametrize("case", training_case_params("graph"))
def test_training_step_stops_compiling_after_warmup(case, one_rank_group, evidence):
    counters, _, _ = _deepspeed_steps(case)
    warmup = case.area_fields["warmup_steps"]
    per_step = [c["compilations"] for c in counters]
    added = per_step[-1] - per_step[warmup - 1]
    evidence.update(config=case.id, compilations_after_each_step=per_step, warmup_steps=warmup,
                    compilations_after_warmup=added)
    assert added == 0, (f"{case.id}: {added} new XLA compilations in the {case.steps - warmup} steps after warm-up "
                        f"(cumulative count per step {per_step}): a per-step value is being traced into the graph "
                        "(as a constant or a shape)")


@pytest.mark.parametrize("case", training_case_params("graph"))
def test_training_step_runs_as_few_graphs_as_a_hand_loop(case, one_rank_group, evidence):
    counters, dtype, micro_batch = _deepspeed_steps(case)
    hand = _hand_loop_steps(case.script, case.steps, dtype, micro_batch)
    allowance = Allowance(**case.area_fields["allowance"])
    measured = {key: (_measured_delta(counters, key, case), _measured_delta(hand, key, case))
                for key in ("executions", "transfers")}
    bounds = {"executions": allowance.executions, "transfers": allowance.transfers}
    evidence.update(config=case.id, steps_measured=case.steps - case.area_fields["warmup_steps"], allowance_why=allowance.why,
                    **{f"{key}_per_step": {"deepspeed": ds, "hand_loop": own, "bound": own + bounds[key]}
                       for key, (ds, own) in measured.items()})
    over = [f"{ds:g} graph {key} per step, the hand loop {own:g}, bound {own + bounds[key]:g}"
            for key, (ds, own) in measured.items() if ds > own + bounds[key]]
    assert not over, (f"{case.id}: {'; '.join(over)} (allowed beyond the hand loop: {allowance.why}): "
                      f"something in the step syncs or reads a device value on the host that DeepSpeed does not ask for")
