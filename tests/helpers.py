"""Helpers more than one test module uses: a fresh interpreter's last JSON line, the harness run as a child process,
and whether a process has ended."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = REPO / "tests" / "candidates"  # deliberately broken candidate accelerators


def run_python(code, accelerator, extra_env=None, script=None):
    """Run code in a fresh interpreter (from `script` when children must re-import it)."""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    if accelerator is not None:
        env["DS_ACCELERATOR"] = accelerator
    env.update(extra_env or {})
    if script is not None:
        script.write_text(code)
    command = [sys.executable, str(script)] if script is not None else [sys.executable, "-c", code]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def deepspeed_source_layout(directory):
    """Make `directory` what a DeepSpeed source checkout puts on sys.path (DeepSpeed's tests/conftest.py, an editable
    install): the installed DeepSpeed's `op_builder` and `accelerator` as top-level packages beside it (in the
    repository, deepspeed/ops/op_builder and deepspeed/accelerator link to them). Returns the env for run_python."""
    deepspeed_dir = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0])
    (directory / "op_builder").symlink_to(deepspeed_dir / "ops" / "op_builder")
    (directory / "accelerator").symlink_to(deepspeed_dir / "accelerator")
    return {"PYTHONPATH": str(directory)}


def last_json(proc):
    """The last stdout line of the finished process `proc`, parsed as JSON; fails the test when it exited non-zero."""
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alive(process):
    """Whether psutil.Process `process` still runs (a zombie has ended; so has one gone since it was listed)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def gone_within(pid, timeout_s):
    """Whether process `pid` has ended, or ends within `timeout_s` seconds (polled every 0.1 s)."""
    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    deadline = time.monotonic() + timeout_s
    while alive(process):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def run_harness(tmp_path, *args):
    """(exit status, report.json or None, stderr) of `python -m harness run` in a child process."""
    out = tmp_path / "run"
    env = {**os.environ, "HARNESS_REPORTS_DIR": str(tmp_path / "reports")}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--backend", "cpu", "--out", str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=2400)
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else None
    return proc.returncode, report, proc.stderr


def _failed(report):
    """The results of `report` that failed or errored, each with its id without "conformance/"."""
    return [(r["id"].removeprefix("conformance/"), r) for r in report["results"] if r["status"] in ("failed", "error")]


def failed_ids(report):
    """The ids, without "conformance/", of the checks that failed or errored in `report`."""
    return {check for check, _ in _failed(report)}


def failures(report, lines=6):
    """Each failed or errored check of `report`, with the first `lines` lines of its message: what a failing
    test prints, so that a failure seen once (on CI) explains itself."""
    return "".join(f"\n{check}: " + "\n".join(r["message"].splitlines()[:lines]) for check, r in _failed(report))
