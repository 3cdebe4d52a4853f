"""The benchmark scripts as a user starts them by hand (`python benchmarks/NAME.py`): bad arguments end
in a usage error, exit 2, before anything is measured, and what a script starts does not outlive it
(a stale op build lock: tests/test_op_builds.py)."""

import subprocess
import sys
import textwrap

import psutil
import pytest
from test_harness_launching import gone_within

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


def test_what_a_benchmark_starts_dies_with_it(tmp_path):
    script = tmp_path / "starts_a_child.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys
        sys.path[:0] = [{str(BENCHMARKS)!r}, {str(REPO)!r}]
        from harness.process_group import dies_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=dies_with_parent)
        print(child.pid, flush=True)
    """))
    pid = int(subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                             check=True).stdout)
    if not gone_within(pid, 10):
        psutil.Process(pid).kill()
        pytest.fail("the child was still running 10 s after the script that started it ended")
