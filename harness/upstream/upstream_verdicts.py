"""Verdicts of an upstream run: each DeepSpeed test's baseline and candidate outcomes, side by side.

A side's outcome is pass, fail or skip: passed/xpassed count as pass; failed, error (the
test's session crashed or ran out of time) and a collection error count as fail; skipped,
DeepSpeed's own xfail marks and a test the side did not collect count as skip.

| baseline | candidate | verdict             | report status |
|----------|-----------|---------------------|---------------|
| pass     | pass      | both-pass           | passed        |
| skip/fail| pass      | candidate-only-pass | passed        |
| pass     | fail      | regression          | failed        |
| pass     | skip      | candidate-skips     | failed        |
| skip     | fail      | candidate-only-fail | failed        |
| fail     | fail      | both-fail           | skipped       |
| fail     | skip      | baseline-fails      | skipped       |
| skip     | skip      | both-skip           | skipped       |

A test the candidate cannot run or gets wrong while the baseline does not fail is a failure
of the candidate; where the baseline fails too there is no verdict on the candidate, which
is reported as skipped (never as a pass), with both sides' reasons.
"""

from collections import Counter

from harness.session.outcomes import build_result

VERDICTS = ("both-pass", "candidate-only-pass", "regression", "candidate-skips", "candidate-only-fail",
            "both-fail", "baseline-fails", "both-skip")
_OUTCOME = {"passed": "pass", "xpassed": "pass", "failed": "fail", "error": "fail", "skipped": "skip",
            "xfailed": "skip"}
_VERDICT = {
    ("pass", "pass"): ("both-pass", "passed"),
    ("skip", "pass"): ("candidate-only-pass", "passed"),
    ("fail", "pass"): ("candidate-only-pass", "passed"),
    ("pass", "fail"): ("regression", "failed"),
    ("pass", "skip"): ("candidate-skips", "failed"),
    ("skip", "fail"): ("candidate-only-fail", "failed"),
    ("fail", "fail"): ("both-fail", "skipped"),
    ("fail", "skip"): ("baseline-fails", "skipped"),
    ("skip", "skip"): ("both-skip", "skipped"),
}
NOT_COLLECTED = {"status": "skipped", "message": "not collected on this side", "duration_s": 0.0, "traceback": ""}


def outcome(record):
    """"pass", "fail" or "skip" for a side record's status (module table; "error" is a fail); KeyError for another status."""
    return _OUTCOME[record["status"]]


def _first_line(record):
    return (record.get("message") or "").strip().splitlines()[0] if (record.get("message") or "").strip() else ""


def _message(verdict, baseline, candidate):
    if verdict in ("both-pass", "both-skip"):
        return _first_line(candidate) if verdict == "both-skip" else ""
    if verdict == "candidate-only-pass":
        return f"the baseline did not pass ({baseline['status']}: {_first_line(baseline)})"
    if verdict in ("both-fail", "baseline-fails"):
        return (f"no verdict: the baseline fails too ({_first_line(baseline)}); "
                f"candidate {candidate['status']}: {_first_line(candidate)}")
    if verdict == "candidate-skips":
        return f"the candidate skips a test the baseline passes: {_first_line(candidate)}"
    return f"candidate {candidate['status']}: {_first_line(candidate)}"


def side_counts(side_results):
    """{status: count} of one side's records (passed, failed, error, skipped, xfailed, xpassed)."""
    return dict(Counter(record["status"] for record in side_results.values()))


def judge(nodeid, baseline, candidate):
    """The report.json result for one test from its two side records (None: not collected there)."""
    baseline, candidate = baseline or NOT_COLLECTED, candidate or NOT_COLLECTED
    verdict, status = _VERDICT[outcome(baseline), outcome(candidate)]
    return build_result(nodeid, status, _message(verdict, baseline, candidate), area="upstream",
                  duration_s=candidate.get("duration_s", 0.0),
                  evidence={"verdict": verdict, "baseline": baseline["status"], "candidate": candidate["status"],
                            "baseline_message": _first_line(baseline), "candidate_message": _first_line(candidate),
                            "baseline_duration_s": baseline.get("duration_s", 0.0)},
                  traceback=candidate.get("traceback", "") if status == "failed" else "")


def judge_all(baseline_results, candidate_results):
    """Results for every test either side ran, in DeepSpeed's order (baseline's first)."""
    order = list(dict.fromkeys([*baseline_results, *candidate_results]))
    return [judge(nodeid, baseline_results.get(nodeid), candidate_results.get(nodeid)) for nodeid in order]


def file_of(nodeid):
    """The test file part of a pytest node id (`unit/x/test_y.py::Class::test[p]` -> `unit/x/test_y.py`)."""
    return nodeid.split("::", 1)[0]


def per_file(results, fp16_known=()):
    """{test file: row} in file order. A row has "tests" (collected on either side),
    the baseline's and the candidate's outcome counts ({"pass", "fail", "skip"}), the verdict counts, and the counts
    a pull request quotes besides the passes: "expected" (known differences that failed, fp16 ones apart), "fp16"
    (those of `fp16_known`, Expectations) and "regressions" (results the run fails on). `results` are judged and have had
    the selection's known differences applied (expectations.apply)."""
    files = {}
    for result in results:
        row = files.setdefault(file_of(result["id"]), _empty_row())
        _count(row, result, any(known.matches(result["id"]) for known in fp16_known))
    return {path: _plain(row) for path, row in files.items()}


def total(files):
    """per_file's rows summed into one row of the same keys."""
    summed = _empty_row()
    for row in files.values():
        for key, value in row.items():
            summed[key] = summed[key] + (Counter(value) if isinstance(value, dict) else value)
    return _plain(summed)


_COUNTS = ("tests", "expected", "fp16", "regressions")


def _empty_row():
    return {**dict.fromkeys(_COUNTS, 0), "baseline": Counter(), "candidate": Counter(), "verdicts": Counter()}


def _count(row, result, fp16):
    evidence = result["evidence"]
    row["tests"] += 1
    for side in ("baseline", "candidate"):
        row[side][_OUTCOME[evidence[side]]] += 1
    row["verdicts"][evidence["verdict"]] += 1
    row["fp16" if fp16 else "expected"] += result["status"] == "xfailed"
    row["regressions"] += result["status"] == "failed"


def _plain(row):
    return {key: dict(value) if isinstance(value, Counter) else value for key, value in row.items()}
