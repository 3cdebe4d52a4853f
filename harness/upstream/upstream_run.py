"""One side (baseline or candidate) of an upstream run: DeepSpeed's pytest in its own tests/,
every test bounded in time, the run resumed after a test that never finished.

DeepSpeed's `DistributedTest` runs each test's ranks in a multiprocessing pool. A rank
that dies there (a signal, a native abort) is never reported: the pool waits for its
result until DeepSpeed's own DS_UNITTEST_TIMEOUT, then `pytest.exit()` ends the whole
session, and closing the pool can itself wait forever on the dead rank. So the pytest
process runs in a session of its own; a watchdog reads the start markers the recorder
plugin (upstream_plugin.py) streams, and when one test has run `timeout + GRACE_S`
seconds, stops the whole process group (pool workers included). The test in progress is
recorded as an error naming why; the session is started again on the tests not yet run.
"""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import child_processes
from harness.session.outcomes import build_result
from harness.session.resume import run_until_every_check_ran
from harness.launching import release_unused_shm_buffers
from harness.paths import REPO
from harness.session.events import read_events
from harness.upstream.upstream_plugin import UPSTREAM_EVENTS_ENV, UPSTREAM_TARGETS_ENV

GRACE_S = 60  # beyond DeepSpeed's own DS_UNITTEST_TIMEOUT, for its pool to report and close
COLLECTION_S = 600  # the least a session may take to collect before it is thought hung
POLL_S = 1.0


@dataclass
class SideRun:
    """What one side produced: {nodeid: result record} plus how the sessions went."""
    results: dict = field(default_factory=dict)
    collected: list = field(default_factory=list)
    sessions: int = 0
    stopped: list = field(default_factory=list)  # node ids the watchdog stopped
    seconds: float = 0.0
    interrupted: bool = False  # Ctrl-C or SIGTERM: the results are what finished before it


def _overdue(events, limit_s, now):
    """The node id of a test started more than limit_s ago without a result, else None."""
    finished = {e["id"] for e in events if e["event"] == "result"}
    running = [e for e in events if e["event"] == "start" and e["id"] not in finished]
    late = [e for e in running if now - e["time"] > limit_s]
    return late[0]["id"] if late else None


IDLE = "(no test running)"  # what the watchdog stopped when the session hung between tests


def _quiet_for(events_path, started, now):
    """Seconds since the session last recorded anything (collection, a test, its end)."""
    try:
        return now - events_path.stat().st_mtime
    except OSError:
        return now - started


def _lost(nodeid, reason):
    return build_result(nodeid, "error", reason, area="upstream")


def _ended_reason(returncode, log_tail):
    hint = next((line.strip() for line in reversed(log_tail) if "Test hanged" in line or "Exit:" in line), "")
    return (f"the test session ended ({child_processes.how_it_ended(returncode)}) before this test reported a result"
            + (f": {hint}" if hint else "; a rank process may have died"))


def run_side(*, name, tests_dir, targets, pytest_args, env, workdir, timeout_s, say, grace_s=GRACE_S):
    """Run `targets` (pytest node ids or paths under tests_dir) with `env`; a SideRun.

    pytest_args: extra arguments (e.g. -k EXPR, -n N). Each session's output goes to
    workdir/<name>-<session>.log. A test is stopped after timeout_s + grace_s seconds.
    """
    run = SideRun()
    started_at = time.monotonic()

    def session(pending):
        run.sessions += 1
        events_path = Path(workdir) / f"{name}-{run.sessions}.jsonl"
        log_path = Path(workdir) / f"{name}-{run.sessions}.log"
        targets_path = Path(workdir) / f"{name}-{run.sessions}.targets.json"
        targets_path.write_text(json.dumps(list(pending)))
        files = list(dict.fromkeys(target.split("::", 1)[0] for target in pending))  # the plugin keeps the targets
        command = [sys.executable, "-m", "pytest", "-p", "harness.upstream.upstream_plugin", "-p", "no:cacheprovider",
                   "-q", "-rN", "--color=no", *pytest_args, *files]
        child_env = {**env, UPSTREAM_EVENTS_ENV: str(events_path), UPSTREAM_TARGETS_ENV: str(targets_path),
                     "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])}
        with open(log_path, "w", encoding="utf-8") as log:
            process = subprocess.Popen(command, cwd=tests_dir, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=child_processes.interrupted_with_parent)
            stopped, session_started = None, time.time()
            try:
                while process.poll() is None:
                    time.sleep(POLL_S)
                    now, events = time.time(), read_events(events_path)
                    stopped = _overdue(events, timeout_s + grace_s, now)
                    # Hung between tests or at exit (a pool that never closes), or in collection, which
                    # imports the whole selection and gets COLLECTION_S at least.
                    quiet_limit = timeout_s + grace_s if events else max(timeout_s + grace_s, COLLECTION_S)
                    if stopped is None and _quiet_for(events_path, session_started, now) > quiet_limit:
                        stopped = IDLE
                    if stopped:
                        say(f"{name}: {stopped} ran past {timeout_s + grace_s} s; stopping its session")
                        child_processes.stop(process)
                        break
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one: leave no rank behind
                run.interrupted = True
                child_processes.stop(process, first=signal.SIGINT)
            child_processes.reap(process)  # pool workers or a forkserver that outlived pytest
        release_unused_shm_buffers(session_started)  # the CPU accelerator's, on ports DeepSpeed's harness chose
        events = read_events(events_path)
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
        collected = next((e["ids"] for e in events if e["event"] == "collected"), None)
        for event in events:
            if event["event"] == "result":
                run.results[event["id"]] = {key: value for key, value in event.items() if key != "event"}
            elif event["event"] == "collection_error":
                run.results[event["id"]] = {**_lost(event["id"], f"collection error: {event['message']}"),
                                            "traceback": event["traceback"]}
        finished = {e["id"] for e in events if e["event"] == "result"}
        for event in events:
            if event["event"] == "start" and event["id"] not in finished:
                if event["id"] == stopped:
                    run.stopped.append(stopped)
                    reason = (f"did not finish within {timeout_s + grace_s} s (DS_UNITTEST_TIMEOUT {timeout_s} s "
                              f"+ {grace_s} s): a rank hung or died, or the test is slower than that; its session "
                              "was stopped")
                elif stopped:
                    continue  # another worker's test, cut off by the stop: it runs again in the next session
                else:
                    reason = _ended_reason(process.returncode, tail)
                run.results[event["id"]] = _lost(event["id"], reason)
        if run.interrupted:
            for event in events:  # an interrupted test is not a result
                if event["event"] == "start" and event["id"] not in finished:
                    run.results.pop(event["id"], None)
            return collected, set(run.results), False
        if collected is None:  # pytest ended before collecting: nothing to resume
            if run.sessions == 1 and not run.results:
                say(f"{name}: pytest collected nothing (exit {process.returncode}); see {log_path}")
            return None, set(run.results), False
        if run.sessions == 1:
            run.collected = list(collected)
        left = [nodeid for nodeid in collected if nodeid not in run.results]
        if left:
            say(f"{name}: session {run.sessions} ended early (exit {process.returncode}); "
                f"resuming with the {len(left)} test(s) not yet run")
        return collected, set(run.results), True

    run_until_every_check_ran(session, targets)
    run.seconds = time.monotonic() - started_at
    return run


def run_side_sessions(*, name, groups, pytest_args, **kwargs):
    """run_side for each (marks, targets) of `groups` (Selection.sessions), in order, the ones with marks under
    `-m marks` (which replaces DeepSpeed's default marker expression); one SideRun of them all. A group's files are
    named <name>-<n> (n from 2) when it is not the first; an interrupted group ends the side."""
    total = SideRun()
    for number, (marks, targets) in enumerate(groups, 1):
        part = run_side(name=name if number == 1 else f"{name}-{number}", targets=targets,
                        pytest_args=[*pytest_args, *(["-m", marks] if marks else [])], **kwargs)
        total.results.update(part.results)
        total.collected += part.collected
        total.sessions += part.sessions
        total.stopped += part.stopped
        total.seconds += part.seconds
        if part.interrupted:
            total.interrupted = True
            break
    return total
