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

Fewer executions are not enough: XLA runs, at each execution, everything the values it reads
need, and keeps nothing else. An accelerator that lets DeepSpeed's host reads compute only what
they read leaves the rest of the step pending, and the next read computes the forward and
backward passes again. So each step's executed graphs (their HLO, which torch_xla dumps in a
fresh process) must hold as many matmuls as the hand loop's: the model computed once per step.
"""

import argparse
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conformance_helpers import import_fixture_script, run_fresh, training_case_params
from xla_probe import graph_counters, graph_dump_env, graph_dump_size, matmuls_in_graph_dump, sync

from harness.launching import single_rank_env
from harness.paths import FIXTURES
from harness.training.training_cases import training_cases

pytestmark = pytest.mark.area("graph")


@dataclass(frozen=True)
class Allowance:
    """Per-step graph executions and transfers a DeepSpeed step may add to the hand loop's."""
    executions: int
    transfers: int
    why: str


_DUMP_ENV = "DS_XLA_GRAPH_DUMP"  # where the measuring process's torch_xla dumps its graphs


def _per_step(step, batches):
    """Run `step(x, y)` on each batch; after each step, the cumulative graph counters and `matmuls`:
    the HLO dot operations of the graphs that step executed (from torch_xla's graph dump)."""
    dump = os.environ[_DUMP_ENV]
    counters = []
    for x, y in batches:
        start = graph_dump_size(dump)
        step(x, y)
        counters.append({**graph_counters(), "matmuls": matmuls_in_graph_dump(dump, start, graph_dump_size(dump))})
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


def measure_in_this_process(case_ids):
    """For each graph case in `case_ids`: the per-step counters of DeepSpeed's step and of the hand
    loop, in a one-rank process group. Run in the fresh process of the `measured` fixture."""
    import deepspeed
    deepspeed.init_distributed()
    results = {}
    for case in training_cases("graph"):
        if case.id in case_ids:
            counters, dtype, micro_batch = _deepspeed_steps(case)
            results[case.id] = {"deepspeed": counters,
                                "hand": _hand_loop_steps(case.script, case.steps, dtype, micro_batch)}
    return results


_MEASURE = """
import json, sys
sys.path.insert(0, {here!r})
import test_graph_steps
print(json.dumps(test_graph_steps.measure_in_this_process({case_ids!r})))
"""


@pytest.fixture(scope="module")
def measured(request, candidate, tmp_path_factory):
    """{case id: {"deepspeed": counters, "hand": counters}} (per step, _per_step's) for the graph cases
    this run selected, measured in one fresh process with the candidate: torch_xla dumps the graphs
    it executes only when told so at its start."""
    case_ids = sorted({item.callspec.params["case"].id for item in request.session.items
                       if item.module is request.module})
    dump = tmp_path_factory.mktemp("graph-dump") / "graphs.hlo"
    return run_fresh(candidate, _MEASURE.format(here=str(Path(__file__).parent), case_ids=case_ids), timeout=1200,
                     env={**single_rank_env(), **graph_dump_env(dump), _DUMP_ENV: str(dump)})


@pytest.mark.parametrize("case", training_case_params("graph"))
def test_training_step_stops_compiling_after_warmup(case, measured, evidence):
    counters = measured[case.id]["deepspeed"]
    warmup = case.area_fields["warmup_steps"]
    per_step = [c["compilations"] for c in counters]
    added = per_step[-1] - per_step[warmup - 1]
    evidence.update(config=case.id, compilations_after_each_step=per_step, warmup_steps=warmup,
                    compilations_after_warmup=added)
    assert added == 0, (f"{case.id}: {added} new XLA compilations in the {case.steps - warmup} steps after warm-up "
                        f"(cumulative count per step {per_step}): a per-step value is being traced into the graph "
                        "(as a constant or a shape)")


@pytest.mark.parametrize("case", training_case_params("graph"))
def test_training_step_runs_as_few_graphs_as_a_hand_loop(case, measured, evidence):
    counters, hand = measured[case.id]["deepspeed"], measured[case.id]["hand"]
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


@pytest.mark.parametrize("case", training_case_params("graph"))
def test_training_step_computes_its_model_once(case, measured, evidence):
    counters, hand = measured[case.id]["deepspeed"], measured[case.id]["hand"]
    warmup = case.area_fields["warmup_steps"]
    deepspeed_matmuls = [c["matmuls"] for c in counters[warmup:]]
    hand_matmuls = [c["matmuls"] for c in hand[warmup:]]
    evidence.update(config=case.id, matmuls_per_step={"deepspeed": deepspeed_matmuls, "hand_loop": hand_matmuls})
    assert deepspeed_matmuls == hand_matmuls, (
        f"{case.id}: the graphs of each step after warm-up executed {deepspeed_matmuls} matmuls, the hand loop's "
        f"{hand_matmuls}: part of the forward and backward passes ran more than once (a host read computed only "
        "the value it read and left the rest of the step pending)")
