"""DeepSpeed's training step on XLA against the loop a TPU user writes by hand, side by side.

Each row runs one process (one rank, PJRT CPU) that trains the same model twice: a hand-written
PyTorch/XLA loop (torch.optim.AdamW, one `torch_xla.sync()` per step, the loss read back each
step) and DeepSpeed with deepspeed_xla (the config's ZeRO stage, DeepSpeed's AdamW, the loss
read back each step, as a training script logs it). After WARMUP steps it measures MEASURED
steps: the median wall time, and per step the XLA graph executions, device-to-host transfers
and compilations (PyTorch/XLA's metrics). Model: 4 Linear(1024, 1024) layers, batch 32.
Targets (issue "performance"): ZeRO 0-2 within 1.10x of the hand loop, ZeRO-3 within 1.5x.

    python -m harness bench --only step_overhead      (or: python benchmarks/step_overhead.py)
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WIDTH, LAYERS, BATCH, LR = 1024, 4, 32, 1e-3
WARMUP, MEASURED = 5, 10
ROWS = [(stage, dtype) for dtype in ("fp32", "bf16") for stage in (0, 1, 2, 3)]
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


def worker(stage, dtype):
    import deepspeed
    import torch
    import torch_xla

    device = torch_xla.device()
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, WIDTH, generator=g)

    hand = _model().to(device, torch_dtype)
    optimizer = torch.optim.AdamW(hand.parameters(), lr=LR)
    hx, hy = x.to(device, torch_dtype), y.to(device, torch_dtype)

    def hand_step():
        loss = torch.nn.functional.mse_loss(hand(hx).float(), hy.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        return loss.item()

    config = {"train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e6, "allgather_bucket_size": 5e6,
                                    "stage3_prefetch_bucket_size": 5e6},
              "bf16": {"enabled": dtype == "bf16"}, "steps_per_print": 10**9, "wall_clock_breakdown": False}
    deepspeed.init_distributed()
    model = _model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    dx, dy = x.to(engine.device, torch_dtype), y.to(engine.device, torch_dtype)

    def deepspeed_step():
        loss = torch.nn.functional.mse_loss(engine(dx).float(), dy.float())
        engine.backward(loss)
        engine.step()
        return loss.item()

    print(json.dumps({"hand": _measure(hand_step), "deepspeed": _measure(deepspeed_step)}), flush=True)


def run_row(stage, dtype):
    from harness import candidates
    from harness.training import accelerator_env, single_rank_env
    env = accelerator_env(candidates.parse_spec(candidates.DEFAULT_SPEC), single_rank_env())
    proc = subprocess.run([sys.executable, __file__, "--worker", "--stage", str(stage), "--dtype", dtype],
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return None, (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:120]
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--stage", type=int)
    parser.add_argument("--dtype")
    parser.add_argument("--only", help="rows as STAGE-DTYPE,... (e.g. 2-fp32)")
    args = parser.parse_args()
    if args.worker:
        return worker(args.stage, args.dtype)
    rows = [row for row in ROWS if not args.only or f"{row[0]}-{row[1]}" in args.only.split(",")]
    print(f"{'zero':<5} {'dtype':<5} {'hand ms':>8} {'ds ms':>8} {'ds/hand':>8}   "
          f"{'exec/step hand ds':>17} {'d2h/step hand ds':>16} {'compiles after warm-up ds':>26}", flush=True)
    missed = []
    for stage, dtype in rows:
        result, error = run_row(stage, dtype)
        if error:
            print(f"{stage:<5} {dtype:<5} failed: {error}", flush=True)
            missed.append((stage, dtype))
            continue
        hand, ds = result["hand"], result["deepspeed"]
        ratio = ds["ms"] / hand["ms"]
        print(f"{stage:<5} {dtype:<5} {hand['ms']:8.1f} {ds['ms']:8.1f} {ratio:7.2f}x   "
              f"{hand['executions']:8.1f} {ds['executions']:8.1f} {hand['transfers']:7.1f} {ds['transfers']:8.1f} "
              f"{ds['compilations'] * MEASURED:26.0f}", flush=True)
        if ratio > TARGET[stage]:
            missed.append((stage, dtype))
    print(f"targets: ZeRO 0-2 <= {TARGET[0]:.2f}x, ZeRO-3 <= {TARGET[3]:.2f}x of the hand loop; "
          f"missed: {', '.join(f'zero{s}-{d}' for s, d in missed) or 'none'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
