"""A run interrupted with Ctrl-C or SIGTERM stops everything it started, still writes its reports,
marked incomplete, and fails."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import alive

REPO = Path(__file__).resolve().parents[1]
RANK_SCRIPT = str(REPO / "fixtures" / "collectives.py")


def start_harness(tmp_path, suite, *args, env=None, sigint_ignored=False, output=subprocess.PIPE):
    """(process, run directory) of `python -m harness run --suite SUITE ARGS` in a session of its own,
    which stands in for a terminal's foreground process group or a CI job; with sigint_ignored, started
    as a shell script's background job is (bash ignores SIGINT there, and the ignoring is inherited).
    Its output goes to `output` (a file, or a pipe read by communicate())."""
    out = tmp_path / "run"
    env = {**os.environ, "HARNESS_REPORTS_DIR": str(tmp_path / "reports"), **(env or {})}
    ignore_sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--backend", "cpu", "--suite", suite,
                             "--out", str(out), *args], cwd=REPO, env=env, start_new_session=True,
                            preexec_fn=ignore_sigint, stdout=output, stderr=subprocess.STDOUT, text=True)
    return proc, out


@pytest.mark.parametrize("sigint", ["handled", "ignored_at_start"])
def test_ctrl_c_writes_incomplete_report(tmp_path, sigint):
    proc, out = start_harness(tmp_path, "interface", sigint_ignored=sigint == "ignored_at_start")
    results = out / "parts" / "results.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not results.is_file() or len(results.read_text().splitlines()) < 20):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False
    assert report["summary"]["total"] >= 5
    assert "INCOMPLETE run" in output and "Incomplete run" in (out / "report.md").read_text()
    assert (tmp_path / "reports" / "latest" / "report.json").is_file()


def processes_of_run(out):
    """Processes started for this run: they inherit the run directory in HARNESS_OUT."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("HARNESS_OUT", "").startswith(str(out)):
                found.append(process)
        except psutil.Error:
            continue
    return found


def wait_for_ranks(out, is_rank, timeout_s=300):
    """The processes of the run whose command line (a list) `is_rank` accepts, once there is one; [] after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ranks = [p for p in processes_of_run(out) if is_rank(p.cmdline())]
        if ranks:
            return ranks
        time.sleep(0.5)
    return []


def stopped_by_sigterm(proc, out):
    """SIGTERM the harness alone (a cancelled CI job) and assert that it fails with a report marked
    incomplete and that nothing started for the run outlives it; the report."""
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and "INCOMPLETE run" in output
    time.sleep(2)
    left = [(p.pid, " ".join(p.cmdline())[:80]) for p in processes_of_run(out) if p.is_running()]
    assert left == [], f"processes outlived the run: {left}"
    return report


def test_sigterm_stops_every_rank_and_writes_incomplete_report(tmp_path):
    """A cancelled CI job: SIGTERM to the harness alone, while DeepSpeed's launcher runs ranks."""
    proc, out = start_harness(tmp_path, "collectives")
    assert wait_for_ranks(out, lambda cmdline: RANK_SCRIPT in cmdline), "no rank of the collectives fixture started"
    stopped_by_sigterm(proc, out)


def test_sigterm_while_the_candidate_imports_stops_the_run_before_any_check(tmp_path):
    """A cancelled CI job while the check process is still importing a slow candidate: the
    interrupt must end the run there, not read as a candidate that failed to import, after which
    the checks would start DeepSpeed's launcher until the harness killed the check process and
    orphaned the launcher's session."""
    started = tmp_path / "import-started"
    proc, out = start_harness(tmp_path, "collectives", "--candidate",
                              f"{REPO}/tests/candidates/slow_import.py:SlowImport",
                              env={"SLOW_IMPORT_STARTED": str(started)})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not started.exists():
        time.sleep(0.2)
    assert started.exists(), "the check process never began importing the candidate"
    report = stopped_by_sigterm(proc, out)
    assert report["results"] == [], "the interrupt was taken for the candidate's failure, and checks ran on"


def test_a_killed_harness_leaves_nothing_running(tmp_path):
    """A SIGKILL of the harness alone (the OOM killer, `kill -9`) forwards nothing: its checks, their
    launchers and ranks must stop on their own, not run the suite (minutes) to its end unwatched."""
    # Output to a file: a closed pipe would stop the checks at their next line, as no CI log does.
    with open(tmp_path / "harness.log", "w") as log:
        proc, out = start_harness(tmp_path, "smoke", output=log)
    assert wait_for_ranks(out, lambda cmdline: any("/fixtures/" in part for part in cmdline)), \
        "no training or collectives fixture started"
    proc.kill()
    proc.wait(timeout=60)
    deadline, left = time.monotonic() + 30, ["not looked yet"]
    while time.monotonic() < deadline and left:
        time.sleep(1)
        left = [(p.pid, " ".join(p.cmdline())[:80]) for p in processes_of_run(out) if alive(p)]
    assert left == [], f"processes outlived the killed harness by 30 s: {left}"
