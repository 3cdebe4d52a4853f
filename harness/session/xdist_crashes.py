"""What the harness's pytest-xdist run does when a worker dies mid-check: file scheduling that survives
it, and a report of the crash that says how the worker's process ended.

The harness runs its checks with `--dist loadfile`: a check module's fixtures (a training run, its
CPU reference) are made once, on one worker. When a worker dies mid-check (the OOM killer, a rank
that takes its worker's process down), pytest-xdist 3.8's file scheduler
(`LoadScopeScheduling.remove_node`):
  - puts every file the dead worker was given back on the queue, finished ones included; a
    replacement worker given a finished file gets an empty list of tests, never reports one done,
    and is never given more or told to stop: the run hangs with every worker idle;
  - leaves the check that crashed pending, so the replacement runs it again, and crashes the same
    way, until the restarts allowed are used up and the run stops with files never run;
  - starts a replacement with one file; a worker holds its last test until it is given another or
    told to stop, so a file of one pending test never runs.
These are pytest-xdist issues #784, #1323, #1327 and #1378 (fixed after 3.8, unreleased). Here a
dead worker's crashed check counts as done (xdist has reported it failed), only files with
checks still to run go back on the queue, and a worker is kept at two pending checks or told to
stop. A worker that dies between its last report and the work it is then sent (execnet: "cannot send")
is left for remove_node. `pytest_xdist_make_scheduler` installs it for `--dist loadfile`: `-p harness.session.xdist_crashes`.

xdist reports the crashed check as failed in phase "???" with "worker 'gw1' crashed while running
...": `pytest_handlecrashitem` words it as the harness words a crash without workers, with the
worker's exit status or signal.
"""

import subprocess

from xdist.scheduler import LoadFileScheduling

from harness.session.outcomes import lost_check_message
from harness.child_processes import how_it_ended

EXIT_WAIT_S = 5.0  # the worker's pipes have closed: its process is gone or about to be


class CrashSafeLoadFileScheduling(LoadFileScheduling):
    """LoadFileScheduling, but a worker's crash neither hangs the run nor runs its check again."""

    def remove_node(self, node):
        """Forget `node`; return the check it was running if it died with checks pending, else None."""
        workload = self.assigned_work.pop(node)
        pending = [(scope, nodeid) for scope, unit in workload.items() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        crashed_scope, crashitem = pending[0]  # a worker runs its checks in the order it was given them
        workload[crashed_scope][crashitem] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node):
        """Give `node` files until it has two pending checks, or tell it to stop once none are left."""
        while True:
            before = self._pending_of(self.assigned_work[node])
            try:
                super()._reschedule(node)
            except OSError:  # it died after its last report; remove_node, next, requeues what it was given
                return
            after = self._pending_of(self.assigned_work[node])
            if node.shutting_down or after >= 2 or after == before:
                return


def pytest_xdist_make_scheduler(config, log):
    """The pytest-xdist hook: CrashSafeLoadFileScheduling for `--dist loadfile`, xdist's own otherwise."""
    if config.getvalue("dist") == "loadfile":
        return CrashSafeLoadFileScheduling(config, log)
    return None


def _exit_of(worker):
    """How `worker`'s process ended ('signal 6 (SIGABRT)'), or None where execnet does not say."""
    popen = getattr(getattr(worker.gateway, "_io", None), "popen", None)  # execnet's popen gateway only
    if popen is None:
        return None
    try:
        return how_it_ended(popen.wait(timeout=EXIT_WAIT_S))
    except subprocess.TimeoutExpired:
        return None


def pytest_handlecrashitem(crashitem, report, sched):
    """The pytest-xdist hook: the crashed check's report names its worker and how the worker ended."""
    report.longrepr = lost_check_message(_exit_of(report.node), worker=report.node.gateway.id)
