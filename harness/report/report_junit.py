"""junit.xml: the run's results as one suite per area, merged with the junit files that
rank processes and other tools drop into the run's parts directory."""

from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite


def _case(result):
    module, _, name = result["id"].rpartition("::")
    case = TestCase(name=name or result["id"], classname=module.replace("/", ".").removesuffix(".py"),
                    time=result["duration_s"])
    status, message = result["status"], result["message"]
    if status in ("failed", "error", "flaky"):
        kind = Error if status == "error" else Failure
        failure = kind(message=message.splitlines()[0] if message else status)
        failure.text = result.get("traceback") or message
        case.result = [failure]
    elif status in ("skipped", "xfailed"):
        reason = message
        if result.get("expectation"):
            reason = f"expected failure: {result['expectation']['reason']} ({result['expectation']['link']})"
        case.result = [Skipped(message=f"{status}: {reason}")]
    return case


def build(results, parts_dir):
    """A JUnitXml: one <testsuite> per area (sorted; "unknown" for none), one testcase per result with its time in seconds
    (failed/flaky as <failure>, error as <error>, skipped/xfailed as <skipped>), then the suites of parts_dir/*.xml."""
    xml = JUnitXml(name="deepspeed-xla conformance")
    for area in sorted({r["area"] or "unknown" for r in results}):
        suite = TestSuite(name=area)
        for result in results:
            if (result["area"] or "unknown") == area:
                suite.add_testcase(_case(result))
        suite.update_statistics()
        xml.add_testsuite(suite)
    for part in sorted(Path(parts_dir).glob("*.xml")):
        xml += JUnitXml.fromfile(str(part))
    xml.update_statistics()
    return xml


def write(results, parts_dir, path):
    """Write build(results, parts_dir) to `path`, pretty-printed."""
    build(results, parts_dir).write(str(path), pretty=True)
