"""Writes a run's report files: report.json (the record), junit.xml (for CI), report.md (for a pull request).

`python -m harness run`, `upstream` and `bench` all write through here; report_json.py,
report_junit.py and report_md.py each render one format.
"""

from . import report_json, report_junit, report_md


def write(report, results, out):
    """report.json, junit.xml (from `results` and the run's parts/) and report.md into run directory `out`."""
    report_json.write(report, out / "report.json")
    report_junit.write(results, out / "parts", out / "junit.xml")
    report_md.write(report, out / "report.md")


def rewrite_summaries(report, out):
    """report.json and report.md again, after a section was added to `report` (junit.xml is unchanged)."""
    report_json.write(report, out / "report.json")
    report_md.write(report, out / "report.md")


def exit_status(report):
    """0 when the run is complete and no check failed, errored or was flaky; else 1."""
    return 0 if report["complete"] and not any(report["summary"][s] for s in report_json.FAILING) else 1
