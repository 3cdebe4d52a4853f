"""harness.session.xdist_crashes: a pytest-xdist worker that dies mid-check under `--dist loadfile` costs
that one check, never a hung run or the checks queued behind it."""

import os
import subprocess
import sys

import pytest

from harness.paths import REPO

pytest_plugins = ["pytester"]  # a real pytest config, for the scheduler's unit test

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
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "harness.session.xdist_crashes",
               "-n", str(workers), "--dist", "loadfile", "-q", "-rf", "--rootdir", str(tmp_path), str(tmp_path)]
    try:
        run = subprocess.run(command, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung after its worker crashed (pytest-xdist's own file scheduling does)")
    summary = run.stdout.strip().splitlines()[-1]
    assert "1 failed, 8 passed" in summary, run.stdout + run.stderr
    assert "FAILED test_b.py::test_b2" in run.stdout, run.stdout


class DyingWorker:
    """A worker as the scheduler sees it (xdist's WorkerController), whose process has died: every
    command sent to it fails as execnet's send to a closed channel does."""

    def __init__(self, name, dead_after_sends):
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.sent, self.dead_after_sends = [], dead_after_sends

    def send_runtest_some(self, indices):
        if len(self.sent) >= self.dead_after_sends:
            raise OSError("cannot send (already closed?)")
        self.sent.append(indices)

    def shutdown(self):
        self.shutting_down = True


def test_work_sent_to_a_worker_that_just_died_goes_to_the_next_one(pytester):
    """The worker died after its last report, before xdist handled its death: the work sent on that
    report fails to send, and must neither end the run nor be lost."""
    from harness.session.xdist_crashes import CrashSafeLoadFileScheduling
    collection = [f"test_{f}.py::test_{f}{i}" for f, n in (("a", 3), ("b", 3), ("c", 2)) for i in range(1, n + 1)]
    scheduler = CrashSafeLoadFileScheduling(pytester.parseconfig("--tx", "popen", "--dist", "loadfile"))
    dying = DyingWorker("gw0", dead_after_sends=2)
    scheduler.add_node(dying)
    scheduler.add_node_collection(dying, collection)
    scheduler.schedule()
    for index in range(4):  # test_a1-a3 and test_b1 reported; then test_b2 took its worker down
        scheduler.mark_test_complete(dying, index)
    assert [[collection[i] for i in indices] for indices in dying.sent] == [collection[:3], collection[3:6]]
    assert scheduler.remove_node(dying) == "test_b.py::test_b2"
    replacement = DyingWorker("gw1", dead_after_sends=10)
    scheduler.add_node(replacement)
    scheduler.add_node_collection(replacement, collection)
    scheduler.schedule()
    assert [collection[i] for indices in replacement.sent for i in indices] == [
        "test_b.py::test_b3", "test_c.py::test_c1", "test_c.py::test_c2"]
