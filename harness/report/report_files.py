"""Writes a run's report files: report.json (the record), junit.xml (for CI), report.md (for a pull request).

`python -m harness run`, `upstream` and `bench` all write through here; report_json.py,
report_junit.py and report_md.py each render one format.
"""


from harness.atomic_files import write_text_atomically
from harness.report import report_json, report_junit, report_md


def write(report, results, out):
    """report.json, junit.xml (from `results` and the run's parts/) and report.md into run directory `out`."""
    _write_summaries(report, out)
    report_junit.write(results, out / "parts", out / "junit.xml")


def rewrite_summaries(report, out):
    """report.json and report.md again, after a section was added to `report` (junit.xml is unchanged)."""
    _write_summaries(report, out)


def _write_summaries(report, out):
    # Both rendered before either is written, each written whole or not at all: a report that fails to
    # render, or an interrupted write, leaves the files as they were.
    texts = {"report.json": report_json.dumps(report), "report.md": report_md.render_within_limit(report)}
    for name, text in texts.items():
        write_text_atomically(out / name, text)


def exit_status(report):
    """0 when the run is complete and no check failed, errored or was flaky; else 1."""
    return 0 if report["complete"] and not any(report["summary"][s] for s in report_json.FAILING) else 1
