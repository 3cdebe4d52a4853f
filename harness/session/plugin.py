"""The pytest plugin behind `python -m harness run` (loaded with `-p harness.session.plugin`).

In every pytest process (the xdist controller and each worker) it installs the candidate
before conformance modules are imported, tags each test with its area and interface
method, and offers the `evidence` fixture. The process that sees every result (the
controller, or the only process) streams them to OUT/parts/results.jsonl as they finish,
so a run that is interrupted or loses its process still leaves what it did.
"""

import gc
import json
import os
from pathlib import Path

import pytest

from harness import environment
from harness.atomic_files import write_text_atomically
from harness.candidate import candidate_env, candidates
from harness.session import checklist
from harness.training import references
from harness.session.outcomes import TIMEOUT_MARK, build_result, result_record
from harness.report.run_dir import OUT_ENV
from harness.session.events import LEFT_OUT_FILE, RESULTS_FILE, SESSION_FILE, EventStream
from harness.session.suites import AREAS, SUITES, area_of_module, left_out_by

CANDIDATE_RESULT_ID = "candidate"


def pytest_addoption(parser):
    """The harness's options: --harness-out (run directory), --reference, --harness-suite."""
    group = parser.getgroup("harness")
    group.addoption("--harness-out", default=os.environ.get(OUT_ENV),
                    help="run directory: results are streamed to <dir>/parts/")
    group.addoption("--reference", dest="harness_reference", **references.REFERENCE_OPTION)
    group.addoption("--harness-suite", default="all", choices=sorted(SUITES),
                    help="the suite being run: a selective one (smoke) deselects the checks it does not name")


def pytest_configure(config):
    """Register the markers and this run's HarnessSession (which installs the candidate first)."""
    config.addinivalue_line("markers", f"area(name): conformance area of a module, one of {', '.join(AREAS)}")
    config.addinivalue_line("markers", "covers(method): the DeepSpeedAccelerator method an interface check (or one of its "
                                       "params) covers (without it: the one its name names, test_<method>[__<aspect>])")
    session = HarnessSession(config)
    config.pluginmanager.register(session, "harness-session")


@pytest.fixture
def evidence(request):
    """A dict a check fills with what it measured (errors, tolerances, curves); lands in the report."""
    data = {}
    request.node.user_properties.append(("evidence", data))
    return data


class HarnessSession:
    """One check process's run: installs the candidate before DeepSpeed is imported, tags every check
    with its area and interface method, and streams each result to <run dir>/parts/ (the controller
    only, under pytest-xdist)."""

    def __init__(self, config):
        self.config = config
        self.candidate_error = None
        self.accelerator = None
        try:
            self.accelerator = candidate_env.install_current()
        except candidates.CandidateError as err:
            self.candidate_error = str(err)
        # torch, torch_xla and DeepSpeed live as long as the process: out of the cyclic collector, they no
        # longer cost every later full collection a walk over ~450k objects (an interface run 19 -> 16 s)
        gc.freeze()
        self.methods = checklist.interface_methods() if self.candidate_error is None else []
        self.problems = {}
        self.phases = {}
        out = config.getoption("harness_out")
        self.recording = bool(out) and not hasattr(config, "workerinput")
        if self.recording:
            self.parts = Path(out) / "parts"
            self.parts.mkdir(parents=True, exist_ok=True)
            self.stream = EventStream(self.parts / RESULTS_FILE)
            self._emit = self.stream.emit
            self._write_session(finished=False)
            if self.candidate_error is not None:
                self._emit({"event": "result",
                            **build_result(CANDIDATE_RESULT_ID, "error", self.candidate_error, area="candidate")})

    # What the candidate and the checklist were, for the report.
    def _write_session(self, finished, exitstatus=None):
        accelerator_class = None
        if self.accelerator is not None:
            accelerator_class = f"{type(self.accelerator).__module__}.{type(self.accelerator).__qualname__}"
        data = {
            "candidate_error": self.candidate_error,
            "accelerator_class": accelerator_class,
            "interface_methods": self.methods,
            "finished": finished,
            "exitstatus": exitstatus,
        }
        (self.parts / SESSION_FILE).write_text(json.dumps(data, indent=1))

    def pytest_report_header(self, config):
        if self.candidate_error:
            return f"harness candidate: FAILED: {self.candidate_error}"
        return f"harness candidate: {type(self.accelerator).__module__}.{type(self.accelerator).__qualname__}"

    # Tagging: area from the module's marker (checked against its file name), the method from the covers
    # marker or the test name (harness/session/checklist.py).
    def pytest_collection_modifyitems(self, session, config, items):
        if self.candidate_error is not None:
            config.hook.pytest_deselected(items=list(items))
            items.clear()
            return
        suite, selected, deselected, left_out = config.getoption("harness_suite"), [], [], {}
        for item in items:
            why = left_out_by(suite, item.nodeid)
            if why is not None:
                deselected.append(item)
                left_out[item.nodeid] = why
                continue
            selected.append(item)
            area, problem = self._area(item)
            method = None
            covers = [name for mark in item.iter_markers("covers") for name in mark.args]
            if area == "interface":
                try:
                    method = checklist.covered_method(item.name, covers, self.methods)
                except checklist.ChecklistError as err:
                    problem = f"interface check {item.name} {err}"
            elif covers:  # coverage counts interface checks only: the marker would mean nothing here
                problem = f"{item.name} is a {area} check; pytest.mark.covers marks interface checks"
            if problem:
                self.problems[item.nodeid] = problem
            item.user_properties.append(("harness", {"area": area, "method": method}))
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = selected
        self._write_left_out(left_out)

    def _write_left_out(self, left_out):
        """The checks the suite left out, for the report. Under xdist the workers collect, each the same checks;
        a session resumed after a crash collects only the checks left to run, and leaves the file as it is."""
        out = self.config.getoption("harness_out")
        if not out or not left_out:
            return
        path = Path(out) / "parts" / LEFT_OUT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(left_out, indent=1))  # workers write at once

    @staticmethod
    def _area(item):
        by_file = area_of_module(item.path)
        marker = item.get_closest_marker("area")
        if marker is None or not marker.args:
            return by_file, f"{item.path.name} declares no area: add pytestmark = pytest.mark.area(\"{by_file}\")"
        if marker.args[0] not in AREAS or marker.args[0] != by_file:
            return by_file, (f"{item.path.name} declares area {marker.args[0]!r}, but its file name puts it "
                             f"in {by_file!r} (conformance/test_<area>_*.py; areas: {', '.join(AREAS)})")
        return marker.args[0], None

    def pytest_runtest_setup(self, item):
        if item.nodeid in self.problems:
            pytest.fail(self.problems[item.nodeid], pytrace=False)

    # Recording (controller only): what was collected and start markers let the report name a test
    # whose process died, and let the harness resume the run after it.
    def pytest_collection_finish(self, session):
        if self.recording:
            self._emit({"event": "collected", "ids": [item.nodeid for item in session.items]})

    def pytest_runtest_logstart(self, nodeid, location):
        if self.recording:
            self._emit({"event": "start", "id": nodeid})

    def pytest_runtest_logreport(self, report):
        if self.recording:
            self.phases.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.recording and nodeid in self.phases:
            record = result_record(nodeid, self.phases.pop(nodeid))
            if record["status"] == "error" and TIMEOUT_MARK in record["message"]:
                record["message"] += environment.lock_note(environment.use_stack_extensions())
            self._emit({"event": "result", **record})

    def pytest_collectreport(self, report):
        if self.recording and report.failed:
            self._emit({"event": "result", **build_result(
                report.nodeid, "error", f"collection error: {report.longreprtext.strip().splitlines()[-1]}",
                area=area_of_module(report.nodeid), traceback=report.longreprtext[-8000:])})

    def pytest_sessionfinish(self, session, exitstatus):
        if not self.recording:
            return
        for nodeid, reports in self.phases.items():  # e.g. a worker crashed after its setup report
            self._emit({"event": "result", **result_record(nodeid, reports)})
        self.phases.clear()
        self._write_session(finished=exitstatus != pytest.ExitCode.INTERRUPTED, exitstatus=int(exitstatus))
        self.stream.close()
