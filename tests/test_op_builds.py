"""DeepSpeed's JIT-built C++ ops: prebuilt once in the stack, never built by a check, and a lock left
by a killed build is reported in one line instead of making every later load wait forever."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import environment

REPO = Path(__file__).resolve().parents[1]


def test_runs_use_the_stack_prebuilt_ops_and_build_nothing():
    root = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert root == Path(sys.prefix) / "torch_extensions", "tests run with the stack's prebuilt ops"
    built = {path: path.stat().st_mtime_ns for path in root.glob("*/*.so")}
    assert {path.parent.name for path in built} >= {"fused_adam", "cpu_adam", "deepspeed_shm_comm"}
    code = ("from deepspeed.accelerator import get_accelerator\n"
            "for name in ('FusedAdamBuilder', 'CPUAdamBuilder', 'ShareMemCommBuilder'):\n"
            "    get_accelerator().create_op_builder(name).load(verbose=False)\n")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "DS_ACCELERATOR": "cpu"}, check=True, timeout=300)
    assert {path: path.stat().st_mtime_ns for path in root.glob("*/*.so")} == built


# every entry point that loads DeepSpeed's ops: the harness's runs and benchmarks, and a benchmark run by hand
@pytest.mark.parametrize("command", [["-m", "harness", "run", "--backend", "cpu", "--suite", "interface"],
                                     ["-m", "harness", "bench", "--only", "peak_memory"],
                                     ["benchmarks/peak_memory.py"]], ids=["run", "bench", "benchmark-script"])
def test_stale_lock_is_one_line_before_anything_runs(tmp_path, command):
    lock = tmp_path / "fused_adam" / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "HARNESS_REPORTS_DIR": str(tmp_path / "reports")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert f"stale build lock {lock}: no process is building there" in proc.stderr
    assert time.monotonic() - started < 60


def test_lock_with_a_build_working_on_it_is_not_stale(tmp_path):
    busy, fresh, stale = (tmp_path / name / "lock" for name in ("busy_op", "fresh_op", "stale_op"))
    for lock in (busy, fresh, stale):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - 3600
    for lock in (busy, stale):
        os.utime(lock, (old, old))
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=busy.parent)
    try:
        time.sleep(0.5)
        assert environment.stale_build_locks(tmp_path) == [stale]
        assert "stale_op/lock (stale: no process is building there)" in environment.lock_note(tmp_path)
        assert "busy_op/lock (a build in progress)" in environment.lock_note(tmp_path)
    finally:
        builder.kill()
        builder.wait()


@pytest.mark.parametrize("preset", [True, False])
def test_stack_extensions_respect_a_directory_the_user_set(tmp_path, preset):
    environ = {"TORCH_EXTENSIONS_DIR": str(tmp_path)} if preset else {}
    chosen = environment.use_stack_extensions(environ)
    assert chosen == (tmp_path if preset else Path(sys.prefix) / "torch_extensions")
    assert environ["TORCH_EXTENSIONS_DIR"] == str(chosen)


def test_prebuilt_ops_are_checked_with_the_ninja_that_built_them():
    stack_bin = str(Path(sys.prefix) / "bin")
    environ = {"PATH": os.pathsep.join(["/usr/bin", stack_bin, "/bin"])}
    environment.use_stack_extensions(environ)
    assert environ["PATH"].split(os.pathsep) == [stack_bin, "/usr/bin", "/bin"]
    elsewhere = {"TORCH_EXTENSIONS_DIR": "/somewhere/else", "PATH": "/usr/bin"}
    environment.use_stack_extensions(elsewhere)
    assert elsewhere["PATH"] == "/usr/bin", "a directory the user chose keeps the user's PATH"
