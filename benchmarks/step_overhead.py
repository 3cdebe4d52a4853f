"""DeepSpeed's training step on XLA against the loop a TPU user writes by hand, side by side.

A world (1 or 2 ranks, one process each, PJRT CPU) trains the same model twice: a hand-written
PyTorch/XLA loop (torch.optim.AdamW after `clip_grad_norm_` at DeepSpeed's
`gradient_clipping`, one `torch_xla.sync()` per step, the loss read back each step; with 2 ranks
the gradients flattened and all-reduced through the same transport DeepSpeed uses,
`deepspeed.comm`, as DDP buckets them) and DeepSpeed with deepspeed_xla (the config's ZeRO stage,
DeepSpeed's AdamW, the loss read back each step, as a training script logs it). Rank 0 reports.
After WARMUP steps of each it measures MEASURED steps of each, one of each in turn: the median
wall time, and per step the XLA graph executions, device-to-host transfers and compilations
(PyTorch/XLA's metrics). Model: 4 Linear(1024, 1024) layers, batch 32. Targets (issue "performance"): ZeRO 0-2 within 1.10x of
the hand loop, ZeRO-3 within 1.5x.

Each row runs in PROCESSES fresh worlds (`--processes`), and its ratio is the median of theirs. A
process's memory layout favours one loop or the other by a few percent for its whole life (fp32
ZeRO-1/2 at one rank, thirteen worlds each: the hand loop 42.8-53.6 ms from world to world, the
ratios 1.03-1.12 and 1.04-1.15, medians 1.06 and 1.07), so one world's ratio is a sample, as for
pyperf's worker processes; the table shows the median and the range. A world that fails fails its
row, named by its number.

As many worlds then run again on DeepSpeed's CPU accelerator against the same loop in eager
PyTorch on CPU, both with torch.optim.AdamW (DeepSpeed's `torch_adam`): that `ds/hand` is what
DeepSpeed's ZeRO layout costs by itself (flat partitions, gradient buckets, copies back), and
`xla/cpu` divides the XLA ratio by it: what the XLA port adds on top (1.00x: nothing).

    python -m harness bench --only step_overhead      (or: python benchmarks/step_overhead.py)
    --no-cpu leaves the CPU-accelerator baseline out.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _ranks import RESULT_PREFIX, failures, launch, results  # noqa: E402
from _script import run, selected_rows  # noqa: E402

WIDTH, LAYERS, BATCH, LR = 1024, 4, 32, 1e-3
# DeepSpeed clips gradients by their global norm unless told otherwise (`gradient_clipping`, 1.0 in
# 0.19.8): the hand loop clips them the same way, so both sides do the same arithmetic.
CLIP = 1.0
WARMUP, MEASURED = 5, 20
PROCESSES = 3  # fresh worlds per row; the row's ratio is the median of theirs
ROWS = [(stage, dtype, world) for world in (1, 2) for dtype in ("fp32", "bf16") for stage in (0, 1, 2, 3)]
TARGET = {0: 1.10, 1: 1.10, 2: 1.10, 3: 1.5}


def _model():
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _counters():
    import torch_xla.debug.metrics as metrics

    def count(name):
        data = metrics.metric_data(name)
        return data[0] if data else 0

    return {"executions": count("ExecuteTime"), "transfers": count("TransferFromDeviceTime"),
            "compilations": count("CompileTime")}


def _measure(steps, on_xla, align, settle):
    """Run each of `steps` ({name: step function}) WARMUP times, then MEASURED rounds of one step of
    each in turn, so that whatever else the machine does slows both sides alike. A step's time runs
    until `settle` returns: on XLA, until the device has finished the step's graphs (a step returns
    once the loss is read back, while graphs launched after the loss may still run, and would
    otherwise be charged to the next step measured, the other side's). `align` runs untimed before
    every measured step: with several ranks, a barrier, so that no step is charged for the time a
    peer still spent in the step before. Per name: the median ms and, on XLA, the counters' mean
    deltas per step."""
    for step in steps.values():
        for _ in range(WARMUP):
            step()
    times = {name: [] for name in steps}
    totals = {name: {} for name in steps}
    for _ in range(MEASURED):
        for name, step in steps.items():
            align()
            before = _counters() if on_xla else {}
            start = time.perf_counter()
            step()
            settle()
            times[name].append(time.perf_counter() - start)
            after = _counters() if on_xla else {}
            for key in before:
                totals[name][key] = totals[name].get(key, 0) + after[key] - before[key]
    return {name: {"ms": statistics.median(times[name]) * 1000,
                   **{key: total / MEASURED for key, total in totals[name].items()}} for name in steps}


def _all_reduce_mean(grads, world, sync):
    """DDP's data-parallel gradient exchange, in one bucket: flatten, all-reduce, average, copy back.
    On XLA the graph is cut first (`sync`), as a PyTorch/XLA user does before values leave the
    device: the host transport would otherwise compute the bucket in a graph of its own, and the
    step the gradients again."""
    import deepspeed.comm as dist
    import torch
    sync()
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def worker(stage, dtype, accelerator):
    import deepspeed
    import deepspeed.comm as dist
    import torch

    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    on_xla = accelerator == "xla"
    if on_xla:
        import torch_xla
        import torch_xla.core.xla_model as xm
        device, sync, settle = torch_xla.device(), torch_xla.sync, xm.wait_device_ops
    else:
        device, sync, settle = torch.device("cpu"), lambda: None, lambda: None
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, WIDTH, generator=g)

    hand = _model().to(device, torch_dtype)
    optimizer = torch.optim.AdamW(hand.parameters(), lr=LR)
    hx, hy = x.to(device, torch_dtype), y.to(device, torch_dtype)

    def hand_step():
        loss = torch.nn.functional.mse_loss(hand(hx).float(), hy.float())
        loss.backward()
        if world > 1:
            _all_reduce_mean([p.grad for p in hand.parameters()], world, sync)
        torch.nn.utils.clip_grad_norm_(hand.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        sync()
        return loss.item()

    # On CPU, DeepSpeed's AdamW would be its C++ FusedAdam, not the hand loop's torch.optim.AdamW: torch_adam
    # makes the optimizer arithmetic the same on both sides, leaving the ZeRO layout as the difference.
    optimizer_params = {"lr": LR} if on_xla else {"lr": LR, "torch_adam": True}
    config = {"train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "AdamW", "params": optimizer_params},
              "gradient_clipping": CLIP,
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e6, "allgather_bucket_size": 5e6,
                                    "stage3_prefetch_bucket_size": 5e6},
              "bf16": {"enabled": dtype == "bf16"}, "steps_per_print": 10**9, "wall_clock_breakdown": False}
    model = _model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    dx, dy = x.to(engine.device, torch_dtype), y.to(engine.device, torch_dtype)

    def deepspeed_step():
        loss = torch.nn.functional.mse_loss(engine(dx).float(), dy.float())
        engine.backward(loss)
        engine.step()
        return loss.item()

    align = dist.barrier if world > 1 else (lambda: None)
    measured = _measure({"hand": hand_step, "deepspeed": deepspeed_step}, on_xla, align, settle)
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(measured), flush=True)


def _world(stage, dtype, world, accelerator):
    """One fresh world's result for a row: {loop: {"ms", counters}}; or None and the first failure."""
    procs = launch(__file__, ["--stage", str(stage), "--dtype", dtype, "--accelerator", accelerator], world,
                   on_cpu_accelerator=accelerator == "cpu")
    lines = list(results(procs))
    failed = failures(procs)
    if failed or not lines:
        return None, (failed or ["no result from rank 0"])[0]
    return json.loads(lines[-1]), None


def _combined(worlds):
    """A row's result over its worlds: per loop, the median of the worlds' median ms and of each
    counter per step, compilations the most any world made; `ratios`, each world's ds/hand, sorted."""
    combined = {}
    for loop in ("hand", "deepspeed"):
        combined[loop] = {key: (max if key == "compilations" else statistics.median)(world[loop][key] for world in worlds)
                          for key in worlds[0][loop]}
    combined["ratios"] = sorted(world["deepspeed"]["ms"] / world["hand"]["ms"] for world in worlds)
    return combined


def run_row(stage, dtype, world, accelerator, processes):
    """The row measured in `processes` fresh worlds, one after another (_combined); or None and the
    first failure, when a world fails."""
    worlds = []
    for number in range(1, processes + 1):
        result, error = _world(stage, dtype, world, accelerator)
        if error:
            return None, f"world {number} of {processes}: {error}"
        worlds.append(result)
    return _combined(worlds), None


def _ratio(result):
    """DeepSpeed's step time over the hand loop's in one row's result: the median of its worlds' ratios."""
    return statistics.median(result["ratios"])


def _spread(result):
    """The lowest and highest of a row's per-world ratios, as `1.04-1.12`."""
    return f"{result['ratios'][0]:.2f}-{result['ratios'][-1]:.2f}"


def _ms_cells(result):
    if result is None:
        return f"{'-':>8} {'-':>8} {'-':>8}"
    return f"{result['hand']['ms']:8.1f} {result['deepspeed']['ms']:8.1f} {_ratio(result):7.2f}x"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--stage", type=int)
    parser.add_argument("--dtype")
    parser.add_argument("--accelerator", choices=("xla", "cpu"), default="xla")
    parser.add_argument("--only", help="rows as STAGE-DTYPE or STAGE-DTYPE-WORLD, comma-separated (e.g. 2-fp32,3-bf16-2)")
    parser.add_argument("--no-cpu", action="store_true", help="leave out the CPU-accelerator baseline")
    parser.add_argument("--processes", type=int, default=PROCESSES,
                        help=f"fresh worlds per row; its ratio is the median of theirs (default {PROCESSES})")
    args = parser.parse_args()
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: a row needs at least one world; give 1 or more")
    if args.worker:
        return worker(args.stage, args.dtype, args.accelerator)
    rows = ROWS if args.only is None else selected_rows(parser, args.only, ROWS)
    print(f"{'':17} {'PJRT CPU, deepspeed_xla':^36}   {'':17} {'':16} {'':9}   "
          f"{'CPU accelerator, eager':^26}", flush=True)
    print(f"{'zero':<5} {'dtype':<5} {'world':>5} {'hand ms':>8} {'ds ms':>8} {'ds/hand':>8} {'range':>9}   "
          f"{'exec/step hand ds':>17} {'d2h/step hand ds':>16} {'compiles':>9}   "
          f"{'hand ms':>8} {'ds ms':>8} {'ds/hand':>8} {'xla/cpu':>8}", flush=True)
    missed = []
    for stage, dtype, world in rows:
        row = f"zero{stage}-{dtype}-world{world}"
        result, error = run_row(stage, dtype, world, "xla", args.processes)
        if error:
            print(f"{stage:<5} {dtype:<5} {world:>5} failed: {error}", flush=True)
            missed.append(f"{row} (failed)")
            continue
        baseline, baseline_error = (None, None) if args.no_cpu else run_row(stage, dtype, world, "cpu", args.processes)
        hand, ds = result["hand"], result["deepspeed"]
        ratio = _ratio(result)
        port = f"{ratio / _ratio(baseline):7.2f}x" if baseline else f"{'-':>8}"
        print(f"{stage:<5} {dtype:<5} {world:>5} {_ms_cells(result)} {_spread(result):>9}   "
              f"{hand['executions']:8.1f} {ds['executions']:8.1f} {hand['transfers']:7.1f} {ds['transfers']:8.1f} "
              f"{ds['compilations'] * MEASURED:9.0f}   {_ms_cells(baseline)} {port}", flush=True)
        if baseline_error:
            print(f"    CPU accelerator baseline failed: {baseline_error}", flush=True)
        if ratio > TARGET[stage]:
            # The ratio to three places: the table's two would show 1.503 as 1.50x, which reads as met.
            missed.append(f"{row} ({ratio:.3f}x, worlds {_spread(result)})")
    print(f"targets: ZeRO 0-2 <= {TARGET[0]:.2f}x, ZeRO-3 <= {TARGET[3]:.2f}x of the hand loop; "
          f"missed: {', '.join(missed) or 'none'}")
    return 1 if missed else 0


if __name__ == "__main__":
    run(main)
