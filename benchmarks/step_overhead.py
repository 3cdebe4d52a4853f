"""DeepSpeed's training step on XLA against the loop a TPU user writes by hand, side by side.

Each row runs one world (1 or 2 ranks, one process each, PJRT CPU) that trains the same model
twice: a hand-written PyTorch/XLA loop (torch.optim.AdamW, one `torch_xla.sync()` per step, the
loss read back each step; with 2 ranks the gradients flattened and all-reduced through the same
transport DeepSpeed uses, `deepspeed.comm`, as DDP buckets them) and DeepSpeed with deepspeed_xla
(the config's ZeRO stage, DeepSpeed's AdamW, the loss read back each step, as a training script
logs it). Rank 0 reports. After WARMUP steps it measures MEASURED
steps: the median wall time, and per step the XLA graph executions, device-to-host transfers
and compilations (PyTorch/XLA's metrics). Model: 4 Linear(1024, 1024) layers, batch 32.
Targets (issue "performance"): ZeRO 0-2 within 1.10x of the hand loop, ZeRO-3 within 1.5x.

    python -m harness bench --only step_overhead      (or: python benchmarks/step_overhead.py)
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

WIDTH, LAYERS, BATCH, LR = 1024, 4, 32, 1e-3
WARMUP, MEASURED = 5, 10
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


def _measure(step):
    """Run `step()` WARMUP + MEASURED times; median ms and per-step counter deltas of the measured ones."""
    for _ in range(WARMUP):
        step()
    before, times = _counters(), []
    for _ in range(MEASURED):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    after = _counters()
    return {"ms": statistics.median(times) * 1000,
            **{key: (after[key] - before[key]) / MEASURED for key in before}}


def _all_reduce_mean(grads, world):
    """DDP's data-parallel gradient exchange, in one bucket: flatten, all-reduce, average, copy back.
    The graph is cut first, as a PyTorch/XLA user does before values leave the device: the host
    transport would otherwise compute the bucket in a graph of its own, and the step the gradients
    again."""
    import deepspeed.comm as dist
    import torch
    import torch_xla
    torch_xla.sync()
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def worker(stage, dtype):
    import deepspeed
    import deepspeed.comm as dist
    import torch
    import torch_xla

    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch_xla.device()
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
            _all_reduce_mean([p.grad for p in hand.parameters()], world)
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        return loss.item()

    config = {"train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "AdamW", "params": {"lr": LR}},
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

    measured = {"hand": _measure(hand_step), "deepspeed": _measure(deepspeed_step)}
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(measured), flush=True)


def run_row(stage, dtype, world):
    procs = launch(__file__, ["--stage", str(stage), "--dtype", dtype], world)
    lines = list(results(procs))
    failed = failures(procs)
    if failed or not lines:
        return None, (failed or ["no result from rank 0"])[0]
    return json.loads(lines[-1]), None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--stage", type=int)
    parser.add_argument("--dtype")
    parser.add_argument("--only", help="rows as STAGE-DTYPE or STAGE-DTYPE-WORLD, comma-separated (e.g. 2-fp32,3-bf16-2)")
    args = parser.parse_args()
    if args.worker:
        return worker(args.stage, args.dtype)
    only = set(args.only.split(",")) if args.only else None
    rows = [(s, d, w) for s, d, w in ROWS if not only or {f"{s}-{d}", f"{s}-{d}-{w}"} & only]
    print(f"{'zero':<5} {'dtype':<5} {'world':>5} {'hand ms':>8} {'ds ms':>8} {'ds/hand':>8}   "
          f"{'exec/step hand ds':>17} {'d2h/step hand ds':>16} {'compiles after warm-up ds':>26}", flush=True)
    missed = []
    for stage, dtype, world in rows:
        result, error = run_row(stage, dtype, world)
        if error:
            print(f"{stage:<5} {dtype:<5} {world:>5} failed: {error}", flush=True)
            missed.append((stage, dtype, world))
            continue
        hand, ds = result["hand"], result["deepspeed"]
        ratio = ds["ms"] / hand["ms"]
        print(f"{stage:<5} {dtype:<5} {world:>5} {hand['ms']:8.1f} {ds['ms']:8.1f} {ratio:7.2f}x   "
              f"{hand['executions']:8.1f} {ds['executions']:8.1f} {hand['transfers']:7.1f} {ds['transfers']:8.1f} "
              f"{ds['compilations'] * MEASURED:26.0f}", flush=True)
        if ratio > TARGET[stage]:
            missed.append((stage, dtype, world))
    print(f"targets: ZeRO 0-2 <= {TARGET[0]:.2f}x, ZeRO-3 <= {TARGET[3]:.2f}x of the hand loop; "
          f"missed: {', '.join(f'zero{s}-{d}-world{w}' for s, d, w in missed) or 'none'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
