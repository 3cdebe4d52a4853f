"""Many small parameters against a few large ones under ZeRO-3 on PJRT CPU, at the accelerator's compile setting
and at XLA's default, side by side.

A ZeRO step makes a few small XLA kernels per parameter, whatever its size, and PJRT CPU compiles each new
graph's kernels with LLVM, so a short run of a model of many small parameters is mostly compilation
(docs/tpu.md, "Compile time grows with the number of parameters"). Each row trains the same 10,000 bf16
weights, elementwise scales as in DeepSpeed's TestZero3ParamPartitioningManyParams, split into `params`
parameters, for 3 ZeRO-3 steps in a 2-rank world on deepspeed_xla; once with the accelerator's setting
(LLVM level 0, backend/cpu_compile.py) and once with `XLA_FLAGS=--xla_backend_optimization_level=3`
(XLA's default). Columns: rank 0's wall time from `deepspeed.initialize` to the last step's end, its
compilations and their seconds (PyTorch/XLA's metrics), and `/few`, the row's wall time over the fewest
parameters' at the same level.

    python benchmarks/compile_time.py [--params 40,20,10]
"""

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _ranks  # noqa: E402
from _script import run  # noqa: E402

ELEMENTS = 10_000
STEPS = 3
WORLD = 2
LEVELS = (("accelerator (0)", None), ("XLA default (3)", "3"))


def worker(params):
    import time

    import deepspeed
    import torch
    import torch_xla.debug.metrics as metrics
    from deepspeed.accelerator import get_accelerator

    sys.path.insert(0, str(REPO / "fixtures"))
    from many_params import CONFIG, build

    size = ELEMENTS // params
    deepspeed.init_distributed()
    model = build(params, size)
    start = time.perf_counter()
    engine, *_ = deepspeed.initialize(model=model, config=CONFIG, model_parameters=model.parameters())
    for _ in range(STEPS):
        out = engine(torch.ones(size, dtype=torch.bfloat16, device=engine.device))
        engine.backward(out.float().sum())
        engine.step()
    get_accelerator().synchronize()
    wall = time.perf_counter() - start
    compiles, compile_ns = metrics.metric_data("CompileTime")[:2]
    if engine.global_rank == 0:
        print(_ranks.RESULT_PREFIX + json.dumps({"wall_s": wall, "compiles": compiles, "compile_s": compile_ns / 1e9}),
              flush=True)


def measure(params, level):
    """Rank 0's result dict for one world, or {"error": line}."""
    saved = os.environ.get("XLA_FLAGS")
    if level:
        os.environ["XLA_FLAGS"] = f"{saved or ''} --xla_backend_optimization_level={level}".strip()
    try:
        procs = _ranks.launch(Path(__file__), [str(params)], WORLD)
    finally:
        if level:
            os.environ.pop("XLA_FLAGS") if saved is None else os.environ.__setitem__("XLA_FLAGS", saved)
    lines = list(_ranks.results(procs))
    failed = _ranks.failures(procs)
    return {"error": failed[0]} if failed or not lines else json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="40,20,10",
                        help=f"comma-separated parameter counts that split {ELEMENTS} weights (default 40,20,10)")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.params.split(",")]
    except ValueError:
        parser.error(f"--params {args.params!r}: comma-separated whole numbers, e.g. 100,2")
    if not counts or any(n < 1 or ELEMENTS % n for n in counts):
        parser.error(f"--params {args.params!r}: each count must divide {ELEMENTS}")
    rows = {(n, name): measure(n, level) for name, level in LEVELS for n in counts}
    print(f"{'params':>6} {'elements':>8}  {'compile setting':<16} {'wall s':>7} {'compiles':>8} {'compile s':>9} "
          f"{'/few':>6}")
    failed = False
    for name, _ in LEVELS:
        few = rows[(min(counts), name)].get("wall_s")
        for n in counts:
            row = rows[(n, name)]
            if "error" in row:
                failed = True
                print(f"{n:>6} {ELEMENTS // n:>8}  {name:<16} {row['error']}")
                continue
            ratio = f"{row['wall_s'] / few:.2f}x" if few else "-"
            print(f"{n:>6} {ELEMENTS // n:>8}  {name:<16} {row['wall_s']:>7.1f} {row['compiles']:>8} "
                  f"{row['compile_s']:>9.1f} {ratio:>6}")
    for n in counts:
        ours, default = rows[(n, LEVELS[0][0])], rows[(n, LEVELS[1][0])]
        if "wall_s" in ours and "wall_s" in default:
            print(f"{n} parameters: XLA's default takes {default['wall_s'] / ours['wall_s']:.2f}x the accelerator's "
                  "setting")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(int(sys.argv[2]))
    else:
        run(main)
