"""harness.xdist_crashes: a pytest-xdist worker that dies mid-check under `--dist loadfile` costs
that one check, never a hung run or the checks queued behind it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# file -> its tests; test_b's second test takes its worker down, as the OOM killer would.
FILES = {
    "test_a.py": ["def test_a1(): pass", "def test_a2(): pass", "def test_a3(): pass"],
    "test_b.py": ["def test_b1(): pass", "def test_b2():\n    import os\n    os._exit(1)", "def test_b3(): pass"],
    "test_c.py": ["def test_c1(): pass", "def test_c2(): pass"],
    "test_d.py": ["def test_d1(): pass"],
}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crashed_worker_costs_its_check_only(tmp_path, workers):
    for name, tests in FILES.items():
        (tmp_path / name).write_text("\n\n".join(tests) + "\n")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.xdist_crashes",
               "-n", str(workers), "--dist", "loadfile", "-q", "-rf", "--rootdir", str(tmp_path), str(tmp_path)]
    try:
        run = subprocess.run(command, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung after its worker crashed (pytest-xdist's own file scheduling does)")
    summary = run.stdout.strip().splitlines()[-1]
    assert "1 failed, 8 passed" in summary, run.stdout + run.stderr
    assert "FAILED test_b.py::test_b2" in run.stdout, run.stdout
