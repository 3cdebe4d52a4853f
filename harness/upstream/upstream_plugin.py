"""The pytest plugin loaded into DeepSpeed's own test session by `python -m harness upstream`.

It runs inside a DeepSpeed checkout's `tests/` (DeepSpeed's conftest.py and pytest.ini in
charge). It keeps the tests the run asked for (UPSTREAM_TARGETS_ENV names a JSON list of node ids
or paths; pytest itself is given only their files, since pytest before 8.4 ends the whole session
on a node id that matches no test), and it records: the tests collected after selection, a start marker per test
with its wall-clock time (the watchdog in upstream_run.py reads it to bound each test),
and one result per test, streamed to the JSON-lines file named by UPSTREAM_EVENTS_ENV as
they finish, so a process that is killed still leaves what it did.
"""

import json
import os
import time

import pytest

from harness.session.events import EventStream
from harness.session.outcomes import result_record

UPSTREAM_EVENTS_ENV = "HARNESS_UPSTREAM_EVENTS"
UPSTREAM_TARGETS_ENV = "HARNESS_UPSTREAM_TARGETS"


def covered(nodeid, targets):
    """Whether pytest node id `nodeid` is one of `targets` or lies under one (`target::...`, `target[...]`)."""
    return any(nodeid == target or nodeid.startswith(target + "::") or nodeid.startswith(target + "[")
               for target in targets)


class UpstreamRecorder:
    """pytest plugin object appending JSON-lines events to `path` as they happen, flushed per line: "collected" (node ids),
    "collection_error", "start" (wall-clock time, seconds since the epoch), "result" (report.json's result), "finished"."""

    def __init__(self, path):
        self.stream = EventStream(path)
        self.phases = {}
        self._emit = self.stream.emit

    def pytest_collection_finish(self, session):
        self._emit({"event": "collected", "ids": [item.nodeid for item in session.items]})

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        # With -n N the controller collects nothing itself; every worker collects the same ids.
        self._emit({"event": "collected", "ids": list(ids)})

    def pytest_collectreport(self, report):
        if report.failed:
            lines = report.longreprtext.strip().splitlines() or ["collection failed"]
            self._emit({"event": "collection_error", "id": report.nodeid, "message": lines[-1],
                        "traceback": report.longreprtext[-8000:]})

    def pytest_runtest_logstart(self, nodeid, location):
        self._emit({"event": "start", "id": nodeid, "time": time.time()})

    def pytest_runtest_logreport(self, report):
        self.phases.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        if nodeid in self.phases:
            self._emit({"event": "result", **result_record(nodeid, self.phases.pop(nodeid))})

    def pytest_sessionfinish(self, session, exitstatus):
        # A test with phases but no finish was cut off (DeepSpeed's pytest.exit on a hung rank):
        # it has a start marker and no result, and the runner says why from the session's end.
        self._emit({"event": "finished", "exitstatus": int(exitstatus)})
        self.stream.close()


def pytest_configure(config):
    """pytest hook: register an UpstreamRecorder on the file $HARNESS_UPSTREAM_EVENTS names, in the controller or a lone
    pytest process only (not in xdist workers); does nothing when the variable is unset."""
    path = os.environ.get(UPSTREAM_EVENTS_ENV)
    # Only the process that reports (not an xdist worker) records.
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(UpstreamRecorder(path), "harness-upstream-recorder")


def pytest_collection_modifyitems(config, items):
    """pytest hook: deselect the items under none of the targets in the JSON file $HARNESS_UPSTREAM_TARGETS names
    (every process, xdist workers included); does nothing when the variable is unset."""
    path = os.environ.get(UPSTREAM_TARGETS_ENV)
    if not path:
        return
    with open(path, encoding="utf-8") as file:
        targets = json.load(file)
    kept, dropped = [], []
    for item in items:
        (kept if covered(item.nodeid, targets) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
