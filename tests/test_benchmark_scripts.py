"""The benchmark scripts as a user starts them by hand (`python benchmarks/NAME.py`): bad arguments end
in a usage error, exit 2, before anything is measured, and what a script starts does not outlive it
(a stale op build lock: tests/test_op_builds.py)."""

import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from helpers import gone_within

from harness.paths import BENCHMARKS, REPO


def _run(script, *args):
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("only", ["9-fp64-3", "2-fp32-3", "0-FP32", ""])
def test_step_overhead_refuses_rows_it_does_not_have(only):
    proc = _run("step_overhead.py", "--no-cpu", "--only", only)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rows are STAGE-DTYPE or STAGE-DTYPE-WORLD" in proc.stderr.splitlines()[-1]
    assert "zero  dtype" not in proc.stdout, "the table started although no row was named right"


def test_step_overhead_refuses_fewer_than_one_world_per_row():
    proc = _run("step_overhead.py", "--no-cpu", "--only", "1-fp32-1", "--processes", "0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--processes 0: a row needs at least one world" in proc.stderr.splitlines()[-1]


def test_a_rows_ratio_is_the_median_of_its_worlds_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_overhead

    def world(hand_ms, ds_ms, ds_compilations):
        return {"hand": {"ms": hand_ms, "executions": 1.0, "compilations": 0.0},
                "deepspeed": {"ms": ds_ms, "executions": 2.0, "compilations": ds_compilations}}

    # Ratios 1.30, 1.02, 1.087: the median ms of each loop come from different worlds (their ratio, 51/46, is 1.109).
    row = step_overhead._combined([world(40.0, 52.0, 0.0), world(50.0, 51.0, 0.05), world(46.0, 50.0, 0.0)])
    assert step_overhead._ratio(row) == pytest.approx(50 / 46)
    assert step_overhead._spread(row) == "1.02-1.30"
    assert row["hand"]["ms"] == 46.0 and row["deepspeed"]["ms"] == 51.0
    assert row["deepspeed"]["compilations"] == 0.05, "a compilation after warm-up in any world must show"
    assert row["deepspeed"]["executions"] == 2.0


def test_peak_memory_refuses_unknown_arguments():
    proc = _run("peak_memory.py", "--bogus")
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr


@pytest.mark.parametrize("params,line", [("3", "each count must divide 10000"), ("many", "comma-separated whole numbers"),
                                         ("0,2", "each count must divide 10000")])
def test_compile_time_refuses_parameter_counts_that_do_not_split_its_weights(params, line):
    proc = _run("compile_time.py", "--params", params)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert line in proc.stderr.splitlines()[-1]
    assert "params" not in proc.stdout, "the table started although the counts were refused"


def test_what_a_benchmark_starts_dies_with_it(tmp_path):
    script = tmp_path / "starts_a_child.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys
        sys.path[:0] = [{str(BENCHMARKS)!r}, {str(REPO)!r}]
        from harness.child_processes import dies_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=dies_with_parent)
        print(child.pid, flush=True)
    """))
    pid = int(subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                             check=True).stdout)
    if not gone_within(pid, 10):
        psutil.Process(pid).kill()
        pytest.fail("the child was still running 10 s after the script that started it ended")


def test_soak_refuses_rows_it_does_not_have():
    proc = _run("soak.py", "--no-load", "--only", "1-fp32-3")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no row named 1-fp32-3" in proc.stderr.splitlines()[-1]
    assert "row " not in proc.stdout, "the table started although no row was named right"


# A stand-in for fixtures/train.py under a stand-in launcher (the same session, environment and deadline, no
# DeepSpeed): it writes its losses, then leaves a process in a session of its own and exits, or hangs.
FAKE_TRAIN = """
import argparse, json, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--losses-out")
parser.add_argument("--then", choices=("escape", "hang"))
args = parser.parse_args()
with open(args.losses_out, "w") as f:
    json.dump({"losses": [0.5, 0.25], "device": "fake"}, f)
if args.then == "escape":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
else:
    time.sleep(120)
"""


@pytest.fixture
def soak(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import soak
    return soak


def _fake_run(soak, monkeypatch, tmp_path, then, deadline_s):
    script = tmp_path / "train.py"  # named as the real one, so the soak takes it for a rank
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(soak, "deepspeed_command", lambda resources, args, port: [
        sys.executable, str(script), "--losses-out", str(args[args.index("--losses-out") + 1]), "--then", then])
    env = dict(soak.accelerator_env(None), RANK="0")
    return soak.soak_run((1, "fp32", 2), 1, tmp_path, env, deadline_s)


def test_soak_stops_a_run_that_finished_but_did_not_exit_with_its_stacks(soak, monkeypatch, tmp_path):
    result = _fake_run(soak, monkeypatch, tmp_path, "hang", deadline_s=5)
    assert result.hung == "finished" and result.failure is None, result
    assert result.losses == [0.5, 0.25] and result.left_behind == 0
    assert "rank 0:" in result.stacks, result.stacks
    # py-spy names each thread and its Python frames; without it, the kernel's view stands in
    assert ("MainThread" if soak._py_spy() else "wait channels") in result.stacks, result.stacks
    assert result.seconds < 60, "the run was not stopped at its deadline"


def test_soak_counts_and_kills_what_a_run_left_behind(soak, monkeypatch, tmp_path):
    result = _fake_run(soak, monkeypatch, tmp_path, "escape", deadline_s=60)
    assert result.hung is None and result.failure is None, result
    assert result.left_behind == 1
    marker = f"{soak.MARKER}={os.getpid()}-1"
    assert not [proc for proc in soak.processes().values() if marker in proc.environ and proc.state != "Z"]


@pytest.mark.slow
def test_soak_one_two_rank_run_ends_and_leaves_nothing():
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "soak.py"), "--runs", "1", "--only", "1-fp32-2", "--no-load",
                           "--deadline", "240"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("1-fp32-2 "))
    runs, hangs, not_exited, in_training, left_behind, failed = map(int, row[1:7])
    assert (runs, hangs, left_behind, failed) == (1, 0, 0, 0), proc.stdout
    assert row[7] == "yes", proc.stdout


def test_an_interrupted_soak_says_how_far_short_of_its_runs_it_stopped(soak, capsys):
    clean = soak.RunResult(row=(1, "fp32", 2), number=1, seconds=1.0, hung=None, failure=None, left_behind=0,
                           losses=[1.0], stacks="")
    assert soak.verdict([clean], [], planned=200)
    assert capsys.readouterr().out.rstrip().endswith(
        "1 runs of 200 (interrupted): 0 hangs (0 finished but did not exit), 0 left behind, 0 failed, losses differ in "
        "0; target 0 hangs, 0 left behind, 0 failed, identical losses: met in the 1 runs made, short of the 200 planned")
    assert soak.verdict([clean], [], planned=1) and capsys.readouterr().out.rstrip().endswith("identical losses: met")
