"""One result per test from pytest's per-phase reports (setup, call, teardown).

Pure functions over report-shaped objects, so the rules are testable without pytest runs.
"""

MESSAGE_LIMIT = 2000
TRACEBACK_LIMIT = 8000


def _text(longrepr):
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # skips: (path, lineno, "Skipped: reason")
        return str(longrepr[-1])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message
    text = str(longrepr)
    # Reports without a crash line (a fixture lookup error) say what went wrong on their `E` lines.
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    return "\n".join(errors) if errors else text


def _clip(text, limit):
    return text if len(text) <= limit else text[:limit] + " ...[truncated]"


TIMEOUT_MARK = "Timeout (>"  # pytest-timeout's failure message
CRASH_PHASE = "???"  # pytest-xdist's phase for a check whose worker died (the message says it all)


def lost_check_message(ended, worker=None):
    """The message of a check whose process ended under it: `ended` says how ('signal 6 (SIGABRT)', or
    None where unknown), `worker` names the pytest-xdist worker it ran on (None: the run's one process)."""
    return (f"the check's process{f' (pytest-xdist worker {worker})' if worker else ''} ended"
            f"{f' ({ended})' if ended else ''} before the check finished; the other checks ran on in "
            + ("the other workers" if worker else "a new process"))


def status_of(reports):
    """(status, deciding report) for one test's phase reports, in the order they ran.

    `error`: the check could not be set up or torn down, ran out of time, or never finished
    (its process ended); `failed`: it ran and got a wrong answer.
    """
    for report in reports:  # a failure in any phase decides, even after a skip (a failing teardown)
        if report.failed:
            if report.when != "call" or TIMEOUT_MARK in _text(report.longrepr):
                return "error", report
            return "failed", report
    for report in reports:
        if report.skipped:
            return ("xfailed" if getattr(report, "wasxfail", None) is not None else "skipped"), report
    call = next((r for r in reports if r.when == "call"), None)
    if call is None:  # set up, then its process or session ended: it never ran to completion
        return "error", None
    if getattr(call, "wasxfail", None) is not None:
        return "xpassed", call
    return "passed", call


def build_result(nodeid, status, message="", *, area=None, method=None, duration_s=0.0, evidence=None, traceback=""):
    """One report.json result: every record of every run (checks, crashes, upstream verdicts) is built here.

    `status` is one of report_json.STATUSES; `message` (one paragraph, clipped to MESSAGE_LIMIT
    characters) says what happened; `evidence` is the check's own dict; `traceback` is clipped."""
    return {
        "id": nodeid,
        "area": area,
        "method": method,
        "status": status,
        "message": _clip(message.strip(), MESSAGE_LIMIT),
        "duration_s": round(duration_s, 4),
        "evidence": evidence or {},
        "traceback": _clip(traceback, TRACEBACK_LIMIT),
    }


def result_record(nodeid, reports):
    """The report.json result for a test (without expectations applied)."""
    status, deciding = status_of(reports)
    properties = {}
    for report in reports:
        properties.update(dict(getattr(report, "user_properties", ()) or ()))
    meta = properties.get("harness", {})
    message = ""
    traceback = ""
    if deciding is None and status == "error":
        message = "the test was set up, then its session or process ended before the test ran to completion"
    if deciding is not None:
        if status in ("xfailed", "xpassed"):
            message = str(deciding.wasxfail)
        else:
            message = _text(deciding.longrepr)
        if status in ("failed", "error"):
            if deciding.when not in ("call", CRASH_PHASE):
                message = f"error in {deciding.when}: {message}"
            traceback = getattr(deciding, "longreprtext", "") or ""
    return build_result(nodeid, status, message, area=meta.get("area"), method=meta.get("method"),
                  duration_s=sum(getattr(r, "duration", 0.0) for r in reports), evidence=properties.get("evidence"),
                  traceback=traceback)


def merge_attempts(attempts, last_interrupted=False):
    """One result per check from the results of repeated runs of the same checks (lists of records).

    A check with the same status every time keeps its first record; one whose status changed is
    `flaky`, with every status in its evidence and the message of its first non-passing attempt.
    A check missing from an attempt is judged on the attempts that ran it; so is the check an
    interrupted last attempt cut off (its `error` says nothing about the check).
    """
    if len(attempts) == 1:
        return list(attempts[0])
    if last_interrupted:
        attempts = [*attempts[:-1], [r for r in attempts[-1] if r["status"] != "error"]]
    merged = {}
    for records in attempts:
        for record in records:
            merged.setdefault(record["id"], []).append(record)
    results = []
    for records in merged.values():
        statuses = [record["status"] for record in records]
        if len(set(statuses)) == 1:
            results.append(records[0])
            continue
        odd = next(record for record in records if record["status"] != "passed")
        results.append({**odd, "status": "flaky",
                        "message": _clip(f"flaky over {len(statuses)} runs ({', '.join(statuses)}): {odd['message']}",
                                         MESSAGE_LIMIT),
                        "evidence": {**odd["evidence"], "statuses": statuses}})
    return results
