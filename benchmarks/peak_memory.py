"""Peak host memory of DeepSpeed on XLA against DeepSpeed's CPU accelerator, side by side.

Each row trains fixtures/train_styles.py (the tutorials' `--style parameters`, one rank, 4
steps) with one ZeRO config, once on each accelerator, each in a process of its own, and
reads that process's peak resident set from the kernel (`os.wait4`'s `ru_maxrss`). On PJRT
CPU the XLA device's buffers are host memory, so the two figures are comparable. Rows:
ZeRO 0-3 with DeepSpeed's default bucket sizes (5e8 elements), then ZeRO 1-3 with buckets
sized to the model. The target is xla/cpu <= 2.0.

    python -m harness bench --only peak_memory        (or: python benchmarks/peak_memory.py)
"""

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.candidate import candidates  # noqa: E402
from harness.candidate.candidate_env import accelerator_env  # noqa: E402
from harness.launching import single_rank_env  # noqa: E402
from harness.paths import FIXTURES  # noqa: E402
from harness.child_processes import dies_with_parent  # noqa: E402
from _script import run  # noqa: E402

TIMEOUT_S = 600  # one training process of 4 steps takes under a minute; a stuck one is stopped
TARGET = 2.0
CONFIGS = [("zero0", "defaults"), ("zero1_default_buckets", "defaults"), ("zero2_default_buckets", "defaults"),
           ("zero3_default_buckets", "defaults"), ("zero1", "sized"), ("zero2", "sized"), ("zero3", "sized")]


def peak_rss_mb(config, candidate):
    """Peak RSS (MiB) of one training process with `config` on `candidate` (None: CPU accelerator)."""
    env = accelerator_env(candidate, single_rank_env())
    command = [sys.executable, str(FIXTURES / "train_styles.py"), "--style", "parameters", "--steps", "4",
               "--deepspeed_config", str(FIXTURES / "configs" / f"{config}.json")]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=dies_with_parent)
    stopped = threading.Event()
    watchdog = threading.Timer(TIMEOUT_S, lambda: (stopped.set(), proc.kill()))
    watchdog.start()
    try:
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
        how = f"stopped after {TIMEOUT_S} s" if stopped.is_set() else f"exit {proc.returncode}"
        return None, f"{how}: {tail[0]}"
    return usage.ru_maxrss / 1024, None


def main():
    argparse.ArgumentParser(description="Peak resident memory, deepspeed_xla against DeepSpeed's CPU accelerator, "
                            "ZeRO 0-3 (about 2 minutes)").parse_args()
    xla = candidates.parse_spec(candidates.DEFAULT_SPEC)
    print(f"{'config':<24} {'buckets':<9} {'cpu MiB':>8} {'xla MiB':>8} {'xla/cpu':>8}", flush=True)
    worst = 0.0
    for config, buckets in CONFIGS:
        cpu, cpu_error = peak_rss_mb(config, None)
        on_xla, xla_error = peak_rss_mb(config, xla)
        ratio = on_xla / cpu if cpu and on_xla else None
        worst = max(worst, ratio or float("inf"))
        cells = [f"{cpu:8.0f}" if cpu else f"{'failed':>8}", f"{on_xla:8.0f}" if on_xla else f"{'failed':>8}",
                 f"{ratio:7.2f}x" if ratio else f"{'-':>8}"]
        print(f"{config:<24} {buckets:<9} {' '.join(cells)}", flush=True)
        for error in filter(None, (cpu_error, xla_error)):
            print(f"    {error}", flush=True)
    verdict = "met" if worst <= TARGET else ("missed: a row failed (above)" if worst == float("inf") else "missed")
    print(f"worst xla/cpu: {worst:.2f}x; target <= {TARGET:.2f}x: {verdict}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    run(main)
