"""`python -m harness diff OLD NEW`: what changed between two runs' report.json (the last nightly
and this pull request's run, say): regressions, fixes, new and removed checks, other changes.

A regression is a check that did not fail in OLD (passed, expected failure, skipped) and fails
in NEW (failed, error, flaky); a fix is the reverse. The benchmark tables `harness bench --report`
added are compared the same way, as `performance/NAME` with status `met` (the benchmark exited 0)
or `missed` (any other exit: a target missed or a row failed), the message being the table's last
line, its verdict; where NEW has no performance section (no bench ran on it) they are left out,
not listed as removed. Exit status: 1 when NEW has regressions, 0 otherwise, 2 when a file is
missing or is not a report.json.
"""

import json
from pathlib import Path

from harness.report.report_json import FAILING, SCHEMA_VERSION, performance_is_valid
from harness.usage import UsageError


_FAILING = FAILING + ("missed",)  # a benchmark that missed its target fails like a check


class DiffError(UsageError):
    """A file that is not a readable report.json (bad usage)."""


def load(path):
    """The report.json at `path` as a dict; DiffError when it is missing, unreadable, not JSON, or not of SCHEMA_VERSION."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise DiffError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DiffError(f"{path} is not a report.json: {err}") from None
    if not isinstance(report, dict) or report.get("schema_version") != SCHEMA_VERSION or "results" not in report:
        raise DiffError(f"{path} is not a report.json of schema version {SCHEMA_VERSION}")
    if not performance_is_valid(report):
        raise DiffError(f"{path}: its performance section is not one harness bench wrote")
    return report


def _performance_results(report):
    """A report's benchmark tables as results: {"id": "performance/NAME", "status": "met" or "missed", "message"}."""
    return [{"id": f"performance/{table['benchmark']}", "status": "met" if table["exit"] == 0 else "missed",
             "message": (table["output"].strip().splitlines() or [""])[-1]} for table in report.get("performance", [])]


def compare(old, new):
    """{kind: [(id, old status, new status, new message)]} for regressions, fixes, new, removed, changed."""
    benchmarked = bool(new.get("performance"))
    before = {r["id"]: r for r in old["results"] + (_performance_results(old) if benchmarked else [])}
    after = {r["id"]: r for r in new["results"] + _performance_results(new)}
    changes = {"regressions": [], "fixes": [], "new": [], "removed": [], "changed": []}
    for test_id, result in after.items():
        was = before[test_id]["status"] if test_id in before else None
        if test_id not in before:
            kind = "new"
        elif was == result["status"]:
            continue
        elif result["status"] in _FAILING and was not in _FAILING:
            kind = "regressions"
        elif was in _FAILING and result["status"] not in _FAILING:
            kind = "fixes"
        else:
            kind = "changed"
        changes[kind].append((test_id, was, result["status"], result.get("message", "")))
    changes["removed"] = [(test_id, r["status"], None, "") for test_id, r in before.items() if test_id not in after]
    return changes


_ONE = {"regressions": "regression", "fixes": "fix", "new": "new", "removed": "removed", "changed": "changed"}


def render(changes, old_path, new_path):
    """The text `diff` prints: a header line with a count per kind, then one indented line per changed check
    (`kind: id (old -> new status)` and the first line of its new message)."""
    counts = ", ".join(f"{len(rows)} {kind}" for kind, rows in changes.items())
    lines = [f"harness diff: {old_path} -> {new_path}: {counts}"]
    for kind, rows in changes.items():
        for test_id, was, now, message in rows:
            first = message.strip().splitlines()[0] if message and message.strip() else ""
            arrow = f"{was or '-'} -> {now or '-'}"
            lines.append(f"  {_ONE[kind]}: {test_id} ({arrow})" + (f": {first}" if first else ""))
    return "\n".join(lines)


def add_parser(commands):
    """Add the `diff` subcommand and its arguments to `commands` (cli's argparse subparsers); returns its parser."""
    diff = commands.add_parser("diff", help="regressions, fixes and new checks between two runs' report.json")
    diff.add_argument("old", help="the earlier run's report.json (e.g. the last nightly)")
    diff.add_argument("new", help="the later run's report.json (e.g. this pull request's)")
    return diff


def run(args):
    """`diff`: print the changes from args.old to args.new; 1 when NEW has regressions or is an incomplete run, else 0.
    DiffError (exit 2) for a file that is not a report.json."""
    old, new = load(args.old), load(args.new)
    changes = compare(old, new)
    print(render(changes, args.old, args.new))
    if not new.get("complete", True):
        print(f"harness diff: {args.new} is an incomplete run: the checks it did not reach are listed as removed")
        return 1
    return 1 if changes["regressions"] else 0
