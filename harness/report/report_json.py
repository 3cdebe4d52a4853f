"""report.json: results read back from the run's parts, summarised, with coverage and environment."""

import json
from pathlib import Path

from harness.session import checklist
from harness.session.outcomes import build_result
from harness.session.events import LEFT_OUT_FILE, RESULTS_FILE, SESSION_FILE, append_event, read_events
from harness.session.suites import area_of_module

SCHEMA_VERSION = 1
STATUSES = ("passed", "failed", "error", "flaky", "xfailed", "xpassed", "skipped")
# Statuses that fail a run: a wrong answer, a check that crashed, timed out or could not be set up,
# and one whose answer changed between repeated runs.
FAILING = ("failed", "error", "flaky")


def read_parts(parts_dir):
    """(results, session) from a run's parts directory; session["left_out"] maps each check the suite left out
    to why ({} when it left none out).

    A test that started but has no result lost its process (a crash, a kill, a timeout
    that ended the process): it is reported as an error, naming that.
    """
    parts_dir = Path(parts_dir)
    session_path = parts_dir / SESSION_FILE
    session = json.loads(session_path.read_text()) if session_path.is_file() else {}
    left_out_path = parts_dir / LEFT_OUT_FILE
    session["left_out"] = json.loads(left_out_path.read_text()) if left_out_path.is_file() else {}
    results, started = {}, []
    for record in _events(parts_dir):
        event = record.pop("event", None)
        if event == "start":
            started.append(record["id"])
        elif event != "collected":
            results[record["id"]] = record
    for nodeid in started:
        if nodeid not in results:
            results[nodeid] = lost_check(nodeid, session.get("interface_methods", []),
                                         "the process running this check ended before the check finished "
                                         "(crash, kill or interruption)")
    return list(results.values()), session


def lost_check(nodeid, methods, message):
    """The error result of a check that started and never reported (its process ended)."""
    area = area_of_module(nodeid.split("::", 1)[0])
    method = checklist.method_of_test_id(nodeid.rsplit("::", 1)[-1], methods) if area == "interface" else None
    return build_result(nodeid, "error", message, area=area, method=method)


def _events(parts_dir):
    return read_events(Path(parts_dir) / RESULTS_FILE)


def append_lost_check(parts_dir, nodeid, message):
    """Add the error result of a check whose process the orchestrator saw end (no check process could write it)."""
    session_path = Path(parts_dir) / SESSION_FILE
    methods = json.loads(session_path.read_text()).get("interface_methods", []) if session_path.is_file() else []
    append_event(Path(parts_dir) / RESULTS_FILE, {"event": "result", **lost_check(nodeid, methods, message)})


def progress(parts_dir):
    """(the checks the last session collected or None, the checks that started, those with a result)."""
    events = _events(parts_dir)
    collected = next((e["ids"] for e in reversed(events) if e.get("event") == "collected"), None)
    return (collected, [e["id"] for e in events if e.get("event") == "start"],
            {e["id"] for e in events if e.get("event") == "result"})


def every_check_ran(parts_dir):
    """True when the checks collected last (and every check started) have a result."""
    collected, started, finished = progress(parts_dir)
    return collected is not None and set(collected) | set(started) <= finished


def summarize(results):
    """{status: count} for every status in STATUSES (zeros included) plus "total"; KeyError for a result of another status."""
    summary = {status: 0 for status in STATUSES}
    for result in results:
        summary[result["status"]] += 1
    summary["total"] = len(results)
    return summary


def by_area(results):
    """{area: summary} for the areas that have results, in a stable order."""
    areas = sorted({r["area"] or "unknown" for r in results})
    return {area: summarize([r for r in results if (r["area"] or "unknown") == area]) for area in areas}


def interface_coverage(results, methods):
    """report.json's coverage.interface: {"total", "checked", "unchecked" (sorted names)} over the accelerator's interface
    `methods`, counting a method as checked when an interface check that was not skipped ran for it."""
    checked = {r["method"] for r in results if r["area"] == "interface" and r["status"] != "skipped"}
    return checklist.coverage(methods, checked)


def build(*, run_id, suite, results, session, environment, complete, unmatched_expectations, artifacts):
    """The report.json dict (schema_version SCHEMA_VERSION): run id, suite, completeness, summary and per-area counts, the
    results, the checks the suite left out (id, reason), interface coverage, expectations (unmatched entries, xpassed
    ids), environment and artifact paths."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "suite": suite,
        "complete": complete,
        "summary": summarize(results),
        "areas": by_area(results),
        "results": results,
        "coverage": {"interface": interface_coverage(results, session.get("interface_methods", []))},
        "left_out": [{"id": nodeid, "reason": why} for nodeid, why in sorted(session.get("left_out", {}).items())],
        "expectations": {"unmatched": unmatched_expectations,
                         "xpassed": [r["id"] for r in results if r["status"] == "xpassed"]},
        "environment": {**environment, "accelerator_class": session.get("accelerator_class")},
        "artifacts": artifacts,
    }


def performance_is_valid(report):
    """Whether `report`'s performance section (absent, or what `harness bench --report` writes) is a list of
    tables, each a dict with at least "benchmark" (its name), "exit" (its exit status) and "output" (its table)."""
    tables = report.get("performance", [])
    return isinstance(tables, list) and all(isinstance(t, dict) and {"benchmark", "exit", "output"} <= t.keys()
                                            for t in tables)


def dumps(report):
    """`report` as the text of report.json: indented JSON; values JSON cannot hold (paths, ...) as str()."""
    return json.dumps(report, indent=2, default=str) + "\n"
