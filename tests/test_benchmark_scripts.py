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
