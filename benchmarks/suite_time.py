"""Where a conformance run's time goes: wall time of a suite, seconds per area (the sum of its
checks' durations from report.json, which with workers exceeds the wall time), the slowest
checks, and the fixed cost every launched rank pays before its first step (a fresh Python
process importing torch_xla and DeepSpeed, and starting the XLA runtime).
Targets (issue "performance"): `--suite smoke` <= 3 minutes on 2 cores; `standard` (`tox -e cpu`) <= 15.
`all` (every check, the nightly's run) has no target: what the standard suite leaves to it is chosen from
these figures (harness/session/suites.py: NIGHTLY).

    python -m harness bench --only suite_time                 (smoke, 2 workers)
    python benchmarks/suite_time.py --suite standard --workers 2 [--reference stored]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _script import run  # noqa: E402
from harness.child_processes import interrupted_with_parent  # noqa: E402

TARGET_S = {"smoke": 180, "standard": 900}
# The runtime starts lazily: time it up to a first tensor on the device and back.
PROCESS_START = ("import time; t = time.perf_counter(); import torch, torch_xla, deepspeed; "
                 "from deepspeed_xla.backend import runtime; "
                 "i = time.perf_counter(); torch.ones(1, device=runtime.torch_device()).cpu(); "
                 "print(i - t, time.perf_counter() - i)")


def process_start_cost():
    """(seconds for a fresh process to import torch_xla + DeepSpeed, seconds from there to a first
    tensor on the XLA device and back: the runtime's start)."""
    out = subprocess.run([sys.executable, "-c", PROCESS_START], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PJRT_DEVICE="CPU"), check=True).stdout
    imports, runtime_start = map(float, out.strip().splitlines()[-1].split())
    return imports, runtime_start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reference", choices=("live", "stored"), default="live",
                        help="where the training checks get the CPU reference curve (harness run --reference)")
    args = parser.parse_args()
    imports, runtime_start = process_start_cost()
    print(f"fixed cost of one process: imports {imports:.1f} s, XLA runtime start {runtime_start:.1f} s", flush=True)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        # The run's reports/latest link stays in the temporary directory (it would dangle in the repository's).
        proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--backend", "cpu", "--suite", args.suite,
                                 "--workers", str(args.workers), "--reference", args.reference, "--out", f"{out}/run"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, HARNESS_REPORTS_DIR=out),
                                preexec_fn=interrupted_with_parent)  # a run left behind would go on for minutes
        try:
            _, stderr = proc.communicate()
        except KeyboardInterrupt:  # the run stops its checks and their ranks on SIGTERM, not on a kill
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            raise
        wall = time.perf_counter() - start
        report_path = Path(out) / "run" / "report.json"
        if not report_path.is_file():
            print(f"no report from the run (exit {proc.returncode}): {(stderr.strip().splitlines() or [''])[-1]}")
            return 1
        report = json.loads(report_path.read_text())
    by_area, counts = defaultdict(float), defaultdict(int)
    for result in report["results"]:
        by_area[result["area"]] += result.get("duration_s", 0.0)
        counts[result["area"]] += 1
    total = sum(by_area.values()) or 1.0
    print(f"{'area':<12}{'checks':>7}{'check s':>9}{'share':>7}")
    for area, seconds in sorted(by_area.items(), key=lambda item: -item[1]):
        print(f"{area:<12}{counts[area]:>7}{seconds:9.1f}{seconds / total:7.0%}")
    print("slowest checks:")
    for result in sorted(report["results"], key=lambda r: -r.get("duration_s", 0.0))[:5]:
        print(f"  {result.get('duration_s', 0.0):7.1f} s  {result['id']}")
    for result in report["results"]:
        if result["status"] not in ("passed", "xfailed"):
            print(f"  {result['status']}: {result['id']}")
    summary = report["summary"]
    target = TARGET_S.get(args.suite)
    print(f"suite {args.suite}, {args.workers} workers, {args.reference} references: wall {wall:.0f} s "
          f"for {summary['total']} checks ({summary['passed']} passed, exit {proc.returncode})"
          + (f"; target <= {target} s: {'met' if wall <= target else 'missed'}" if target else ""))
    return 1 if proc.returncode or (target and wall > target) else 0


if __name__ == "__main__":
    run(main)
