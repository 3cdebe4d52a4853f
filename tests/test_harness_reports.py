"""Report building from a run's parts, with fake results: outcomes, expectations, report.json,
junit merging, report.md, loss-curve plots, interrupted runs, reports/latest, fingerprint."""

import json
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from junitparser import JUnitXml

from harness import cli, environment
from harness.commands import bench as bench_command
from harness.commands import run as run_command
from harness.paths import REPO
from harness.report import curves, report_files, run_dir
from harness.session import expectations, suites
from harness.session.outcomes import result_record, status_of

DEVICE = "conformance/test_interface_device.py"


def phase(when, outcome, **extra):
    return SimpleNamespace(when=when, outcome=outcome, passed=outcome == "passed", failed=outcome == "failed",
                           skipped=outcome == "skipped", longrepr=extra.pop("longrepr", None), duration=0.5,
                           user_properties=extra.pop("user_properties", []), longreprtext="", **extra)


@pytest.mark.parametrize("phases, status", [
    ([phase("setup", "passed"), phase("call", "passed"), phase("teardown", "passed")], "passed"),
    ([phase("setup", "passed"), phase("call", "failed"), phase("teardown", "passed")], "failed"),
    ([phase("setup", "failed"), phase("teardown", "passed")], "error"),  # could not be set up
    ([phase("setup", "passed"), phase("call", "passed"), phase("teardown", "failed")], "error"),
    ([phase("setup", "passed"), phase("call", "failed", longrepr=SimpleNamespace(reprcrash=SimpleNamespace(
        message="Failed: Timeout (>600.0s) from pytest-timeout."))), phase("teardown", "passed")], "error"),
    ([phase("setup", "skipped", longrepr=("f.py", 1, "Skipped: TPU only")), phase("teardown", "passed")], "skipped"),
    ([phase("setup", "passed"), phase("call", "skipped", wasxfail="known"), phase("teardown", "passed")], "xfailed"),
    ([phase("setup", "passed"), phase("call", "passed", wasxfail="known"), phase("teardown", "passed")], "xpassed"),
    ([phase("setup", "passed")], "error"),  # its session ended during the test (pytest.exit, a lost worker)
    ([phase("setup", "passed"), phase("call", "skipped"), phase("teardown", "failed")], "error"),
])
def test_status_of(phases, status):
    assert status_of(phases)[0] == status


def test_result_record_carries_area_method_evidence_and_reason():
    meta = ("harness", {"area": "interface", "method": "synchronize"})
    record = result_record("x::test_synchronize", [
        phase("setup", "passed", user_properties=[meta]),
        phase("call", "failed", user_properties=[meta, ("evidence", {"pending": ["aten::add"]})],
              longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message="AssertionError: still pending"))),
        phase("teardown", "passed", user_properties=[meta])])
    assert record["area"] == "interface" and record["method"] == "synchronize" and record["status"] == "failed"
    assert record["message"] == "AssertionError: still pending" and record["evidence"] == {"pending": ["aten::add"]}
    assert record["duration_s"] == 1.5
    skipped = result_record("x::t", [phase("setup", "skipped", longrepr=("f.py", 1, "Skipped: TPU only"))])
    assert skipped["message"] == "Skipped: TPU only"


def write_parts(out, records, finished=True, methods=("synchronize", "device_name", "on_accelerator")):
    parts = out / "parts"
    parts.mkdir(parents=True)
    (parts / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (parts / "session.json").write_text(json.dumps({"interface_methods": list(methods), "finished": finished,
                                                    "accelerator_class": "fake.Accel"}))


def result(test_id, status, method=None, evidence=None, message=""):
    return {"event": "result", "id": test_id, "area": "interface", "method": method, "status": status,
            "message": message, "duration_s": 0.1, "evidence": evidence or {}, "traceback": ""}


FINGERPRINT = {"python": "3.11", "backend": "cpu", "device_kind": "PJRT CPU", "device_count": 1,
               "candidate": "fake", "env": {"PJRT_DEVICE": "CPU"}}


def finish(out, expected=(), child_rc=1, interrupted=False, suite="interface", child_rcs=None):
    return run_command.finish(out=out, run_id="run-1", suite=suite, expected=list(expected), env_fingerprint=FINGERPRINT,
                      child_rcs=child_rcs or [child_rc], interrupted=interrupted)


def test_report_from_parts(tmp_path):
    curve = {"reference": [0.9, 0.7, 0.6], "candidate": [0.9, 0.71, 0.62]}
    write_parts(tmp_path, [
        {"event": "start", "id": f"{DEVICE}::test_synchronize[None]"},
        result(f"{DEVICE}::test_synchronize[None]", "failed", "synchronize", message="AssertionError: pending"),
        result(f"{DEVICE}::test_device_name[0-int]", "passed", "device_name", evidence=curve),
        result(f"{DEVICE}::test_on_accelerator", "skipped", "on_accelerator", message="Skipped: why"),
    ])
    (tmp_path / "parts" / "rank1.xml").write_text(
        '<testsuite name="zero-rank1" tests="1"><testcase classname="zero" name="test_rank1" time="1"/></testsuite>')
    report = finish(tmp_path)
    assert report["schema_version"] == 1 and report["complete"] is True
    assert report["summary"] == {"passed": 1, "failed": 1, "error": 0, "flaky": 0, "xfailed": 0, "xpassed": 0,
                                 "skipped": 1, "total": 3}
    # a skipped check does not count as checking its method
    assert report["coverage"]["interface"] == {"total": 3, "checked": 2, "unchecked": ["on_accelerator"]}
    assert report["environment"]["accelerator_class"] == "fake.Accel"
    assert json.loads((tmp_path / "report.json").read_text())["summary"] == report["summary"]
    assert report["artifacts"] == {f"{DEVICE}::test_device_name[0-int]": "curves/" + next(
        p.name for p in (tmp_path / "curves").iterdir())}

    junit = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    names = {case.name for suite in junit for case in suite}
    assert {"test_synchronize[None]", "test_device_name[0-int]", "test_rank1"} <= names
    assert junit.failures == 1 and junit.tests == 4

    markdown = (tmp_path / "report.md").read_text()
    assert "## DeepSpeed XLA conformance: FAIL" in markdown
    assert "| interface | 1 | 1 | 0 | 0 | 0 | 0 | 1 | 3 |" in markdown
    assert "<details><summary>❌ <code>conformance/test_interface_device.py::test_synchronize[None]</code>" in markdown
    assert "Interface coverage: 2/3" in markdown and "`on_accelerator`" in markdown
    assert "![" not in markdown, "a pasted report must not embed images it cannot carry"
    assert "`curves/" in markdown and "| env PJRT_DEVICE | `CPU` |" in markdown
    assert report_files.exit_status(report) == 1


def test_areas_of_the_suite_where_no_check_ran_are_named(tmp_path):
    write_parts(tmp_path, [result(f"{DEVICE}::test_synchronize[None]", "passed", "synchronize")])
    finish(tmp_path, child_rc=0, suite="all")
    markdown = (tmp_path / "report.md").read_text()
    unrun = ", ".join(f"`{area}`" for area in suites.AREAS if area != "interface")
    assert f"No check ran in: {unrun}." in markdown, markdown


def test_checks_the_suite_left_out_are_listed_with_their_reason(tmp_path):
    write_parts(tmp_path, [result(f"{DEVICE}::test_synchronize[None]", "passed", "synchronize")])
    zero = "conformance/test_zero_equivalence.py::test_zero_stage_loss_matches_cpu_reference"
    left_out = {f"{zero}[{case}]": suites.left_out_by("standard", f"{zero}[{case}]")
                for case in ("zero0-fp32-2rank", "zero1-fp32-2rank")}
    (tmp_path / "parts" / "left_out.json").write_text(json.dumps(left_out))
    report = finish(tmp_path, child_rc=0, suite="standard")
    assert report["left_out"] == [{"id": nodeid, "reason": why} for nodeid, why in sorted(left_out.items())]
    assert report["summary"]["total"] == 1, "a check left out is not a result"
    markdown = (tmp_path / "report.md").read_text()
    assert "Left out by suite `standard` (2 checks; `--suite all` runs every check):" in markdown, markdown
    assert "ZeRO-0 at 2 ranks in bf16" in markdown
    assert "`test_zero_stage_loss_matches_cpu_reference[zero0-fp32-2rank]`" in markdown
    assert "2 left out by suite standard" in run_command._summary_line(report)


def test_a_run_that_left_nothing_out_says_nothing_of_it(tmp_path):
    write_parts(tmp_path, [result(f"{DEVICE}::test_synchronize[None]", "passed", "synchronize")])
    report = finish(tmp_path, child_rc=0, suite="interface")
    assert report["left_out"] == [] and "Left out" not in (tmp_path / "report.md").read_text()


def test_suite_without_the_interface_area_does_not_list_interface_methods(tmp_path):
    write_parts(tmp_path, [])
    finish(tmp_path, child_rc=0, suite="launcher")
    markdown = (tmp_path / "report.md").read_text()
    assert "Interface coverage: not measured (suite `launcher`" in markdown and "`synchronize`" not in markdown


def test_interrupted_run_reports_incomplete_and_the_check_that_was_running(tmp_path):
    write_parts(tmp_path, [
        result(f"{DEVICE}::test_device_name[0-int]", "passed", "device_name"),
        {"event": "start", "id": f"{DEVICE}::test_synchronize[None]"},
    ], finished=False)
    report = finish(tmp_path, child_rc=-2, interrupted=True)
    assert report["complete"] is False and report_files.exit_status(report) == 1
    dead = next(r for r in report["results"] if r["id"].endswith("test_synchronize[None]"))
    assert dead["status"] == "error" and "ended before the check finished" in dead["message"]
    assert dead["area"] == "interface" and dead["method"] == "synchronize"
    assert "Incomplete run" in (tmp_path / "report.md").read_text()


def test_run_without_any_parts_still_writes_a_report(tmp_path):
    report = finish(tmp_path, child_rc=-9)
    assert report["complete"] is False and report["summary"]["total"] == 0
    assert (tmp_path / "report.md").is_file() and (tmp_path / "junit.xml").is_file()


def test_expectations_reclassify_and_report(tmp_path):
    (tmp_path / "e.toml").write_text(f'''
[[expected_failure]]
id = "{DEVICE}::test_synchronize[*]"
reason = "known"
link = "https://example.org/1"
[[expected_failure]]
id = "{DEVICE}::test_device_name[0-int]"
reason = "thought broken"
link = "https://example.org/2"
[[expected_failure]]
id = "{DEVICE}::test_gone"
reason = "stale"
link = "https://example.org/3"
''')
    write_parts(tmp_path, [result(f"{DEVICE}::test_synchronize[None]", "failed", "synchronize"),
                           result(f"{DEVICE}::test_device_name[0-int]", "passed", "device_name")])
    report = finish(tmp_path, expected=expectations.load(tmp_path / "e.toml"))
    statuses = {r["id"].rsplit("::", 1)[1]: r["status"] for r in report["results"]}
    assert statuses == {"test_synchronize[None]": "xfailed", "test_device_name[0-int]": "xpassed"}
    assert report["expectations"]["unmatched"] == [{"id": f"{DEVICE}::test_gone", "reason": "stale",
                                                    "link": "https://example.org/3"}]
    assert report_files.exit_status(report) == 0


@pytest.mark.parametrize("text, reason", [
    ('[[expected_failure]]\nid = "x"\nreason = "r"\n', "lacks link"),
    ('[[expected_failure]]\nid = "x"\nlink = "l"\nreason = " "\n', "lacks reason"),
    ('expected_failure = "x"\n', "must be an array of tables"),
    ("not toml [", "not valid TOML"),
])
def test_malformed_expectations(tmp_path, text, reason):
    path = tmp_path / "e.toml"
    path.write_text(text)
    with pytest.raises(expectations.ExpectationsError, match=reason):
        expectations.load(path)


def test_expectation_patterns_take_brackets_literally():
    entry = expectations.Expectation("m.py::test_x[*]", "r", "l")
    assert entry.matches("m.py::test_x[int]") and not entry.matches("m.py::test_x_other")
    assert not expectations.Expectation("m.py::test_x[i]", "r", "l").matches("m.py::test_x[int]")
    assert entry.concerns("m.py") and not entry.concerns("n.py")


def test_curves_plot_png(tmp_path):
    path = curves.plot({"reference": [1.0, 0.8, 0.7], "candidate": [1.0, 0.81, 0.72]}, tmp_path / "c.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not curves.has_curves({"reference": [1.0]}) and not curves.has_curves({"max_abs_error": 0.1})


def test_latest_points_at_newest_run(tmp_path, monkeypatch):
    monkeypatch.setenv(run_dir.REPORTS_ENV, str(tmp_path / "reports"))
    first, second = (run_dir.prepare(tmp_path / "reports" / name) for name in ("run-a", "run-b"))
    (second / "report.json").write_text("{}")
    run_dir.point_latest(first)
    latest = run_dir.point_latest(second)
    assert latest.resolve() == second and (latest / "report.json").is_file()


def test_fingerprint_is_an_allowlist(monkeypatch):
    env = {"PJRT_DEVICE": "CPU", "HF_TOKEN": "secret", "AWS_SECRET_ACCESS_KEY": "secret", "HOME": "/root"}
    fingerprint = environment.fingerprint("cpu", "deepspeed_xla", "PJRT CPU", 1, env)
    assert fingerprint["env"] == {"PJRT_DEVICE": "CPU"}
    assert "secret" not in json.dumps(fingerprint)
    assert fingerprint["torch"] and fingerprint["deepspeed"] and fingerprint["torch_xla"]


def test_tpu_devices_come_from_tpu_infos_device_api(monkeypatch):
    class Chip:
        def __str__(self):
            return "TPU v5e chip"

    fake = types.ModuleType("tpu_info.device")
    fake.get_local_chips = lambda: (Chip(), 8)
    monkeypatch.setitem(sys.modules, "tpu_info", types.ModuleType("tpu_info"))
    monkeypatch.setitem(sys.modules, "tpu_info.device", fake)
    sys.modules["tpu_info"].device = fake
    assert environment.devices("tpu") == ("TPU v5e chip", 8)


def test_report_says_where_reference_curves_came_from(tmp_path):
    curve = {"reference": [0.9, 0.7], "candidate": [0.9, 0.7]}
    stored = dict(curve, reference_source="stored", reference_file="fixtures/references/cpu/zero/a.json")
    stale = dict(curve, reference_source="live", reference_file="fixtures/references/cpu/zero/b.json",
                 reference_note="computed live: deepspeed is 0.19.9, recorded with 0.19.8")
    live = dict(curve, reference_source="live", reference_file="fixtures/references/cpu/zero/c.json",
                stored_max_rel_diff=2.5e-8)
    write_parts(tmp_path, [result("conformance/test_zero_equivalence.py::test_a", "passed", evidence=stored),
                           result("conformance/test_zero_equivalence.py::test_b", "passed", evidence=stale),
                           result("conformance/test_zero_equivalence.py::test_c", "passed", evidence=live)])
    finish(tmp_path, child_rc=0, suite="zero")
    markdown = (tmp_path / "report.md").read_text()
    assert ("CPU reference curves: 1 stored (fixtures/references/, recorded for this torch and DeepSpeed), "
            "2 trained live in this run. 1 stored curve(s) could not be used; each check's evidence says why. "
            "The 1 trained here differ from their stored curves by at most 2.5e-08 relative.") in markdown, markdown


def test_repeated_runs_report_a_changing_check_as_flaky_never_as_a_pass(tmp_path):
    statuses = {"t_steady": ["passed"] * 3, "t_flaky": ["passed", "failed", "passed"], "t_broken": ["failed"] * 3}
    for attempt in (1, 2, 3):
        write_parts(run_command.repeat_dir(tmp_path, attempt), [
            result(f"{DEVICE}::{name}", runs[attempt - 1], "synchronize", message=f"{runs[attempt - 1]} in {attempt}")
            for name, runs in statuses.items()])
    report = finish(tmp_path, child_rcs=[1, 1, 1])
    by_id = {r["id"].split("::")[1]: r for r in report["results"]}
    assert {name: r["status"] for name, r in by_id.items()} == {
        "t_steady": "passed", "t_flaky": "flaky", "t_broken": "failed"}
    assert by_id["t_flaky"]["evidence"]["statuses"] == ["passed", "failed", "passed"]
    assert by_id["t_flaky"]["message"] == "flaky over 3 runs (passed, failed, passed): failed in 2"
    assert report["summary"]["flaky"] == 1 and report["repeat"] == 3 and report_files.exit_status(report) == 1
    assert "Flaky (status changed between repeated runs) (1)" in (tmp_path / "report.md").read_text()
    junit = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert junit.failures == 2


def test_repeated_run_with_no_changes_passes(tmp_path):
    for attempt in (1, 2):
        write_parts(run_command.repeat_dir(tmp_path, attempt), [result(f"{DEVICE}::t", "passed", "synchronize")])
    report = finish(tmp_path, child_rcs=[0, 0])
    assert report["summary"]["passed"] == 1 and report["summary"]["total"] == 1 and report_files.exit_status(report) == 0


def many_failures(count, traceback_lines=200):
    trace = "\n".join(f"  File \"{REPO_PATH}/conformance/x.py\", line {i}, in check" for i in range(traceback_lines))
    return [result(f"{DEVICE}::test_broken_{i}", "failed", "synchronize", message=f"AssertionError: wrong {i}",
                   evidence={"max_rel_err": 0.5, "note": "x" * 3000}) | {"traceback": trace} for i in range(count)]


REPO_PATH = str(REPO)


@pytest.mark.parametrize("count", [1, 40, 400])
def test_report_md_stays_under_a_pr_comment_and_names_no_local_path(tmp_path, count):
    write_parts(tmp_path, many_failures(count))
    finish(tmp_path)
    markdown = (tmp_path / "report.md").read_text()
    assert len(markdown.encode("utf-8")) <= 60_000
    assert REPO_PATH not in markdown and str(Path.home()) + "/" not in markdown
    assert "<repo>/conformance/x.py" in markdown or count > 1
    if count <= 40:
        assert f"test_broken_{count - 1}" in markdown, "every failure is listed, however short its detail"
    else:
        assert markdown.endswith("> report.md cut at its size limit; the complete report is report.json.\n")
    report = json.loads((tmp_path / "report.json").read_text())
    assert REPO_PATH in report["results"][0]["traceback"], "report.json keeps the full detail"


def test_report_md_states_the_stack_and_the_transport(tmp_path):
    write_parts(tmp_path, [result(f"{DEVICE}::t", "passed", "synchronize")])
    run_command.finish(out=tmp_path, run_id="run-1", suite="interface", expected=[], child_rcs=[0], interrupted=False,
               env_fingerprint={**FINGERPRINT, "deepspeed": "0.19.8", "torch": "2.9.0", "torch_xla": "2.9.0",
                                "collective_transport": environment.collective_transport("deepspeed_xla", "cpu", {})})
    head = (tmp_path / "report.md").read_text().splitlines()[4]
    assert head == ("DeepSpeed 0.19.8, torch 2.9.0, torch_xla 2.9.0; collectives: host bridge (gloo between host "
                    "copies)")


def report_with(statuses, complete=True):
    return {"schema_version": 1, "complete": complete,
            "results": [{"id": test_id, "status": status, "message": f"{status} msg"}
                        for test_id, status in statuses.items()]}


def test_diff_against_an_incomplete_run_fails(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(report_with({"a": "passed", "b": "passed"})))
    (tmp_path / "new.json").write_text(json.dumps(report_with({"a": "passed"}, complete=False)))
    proc = subprocess.run([sys.executable, "-m", "harness", "diff", str(tmp_path / "old.json"),
                           str(tmp_path / "new.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "is an incomplete run" in proc.stdout and "  removed: b" in proc.stdout


def test_redaction_replaces_paths_and_the_host_name_only_where_they_stand(monkeypatch):
    from harness.report import report_md
    monkeypatch.setattr(report_md.socket, "gethostname", lambda: "test")
    # A checkout under the temporary or home directory would rightly show the text after it as a path there
    # ("<tmp>/checkoutx"): those two are put where no checkout is, so the repository's own pattern is what is checked.
    monkeypatch.setattr(report_md.tempfile, "gettempdir", lambda: "/nowhere-tmp")
    monkeypatch.setattr(report_md.Path, "home", staticmethod(lambda: Path("/nowhere-home")))
    text = f"{REPO}/conformance/test_collectives.py::test_all_reduce on test, {REPO}x"
    assert report_md.redact(text) == f"<repo>/conformance/test_collectives.py::test_all_reduce on <host>, {REPO}x"


def test_diff_lists_regressions_fixes_new_and_removed_checks(tmp_path):
    old = report_with({"a": "passed", "b": "failed", "c": "passed", "d": "skipped", "gone": "passed", "e": "xfailed"})
    new = report_with({"a": "error", "b": "passed", "c": "passed", "d": "flaky", "fresh": "failed", "e": "xpassed"})
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    proc = subprocess.run([sys.executable, "-m", "harness", "diff", str(tmp_path / "old.json"), str(tmp_path / "new.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("2 regressions, 1 fixes, 1 new, 1 removed, 1 changed")
    assert "  regression: a (passed -> error): error msg" in lines and "  regression: d (skipped -> flaky): flaky msg" in lines
    assert "  fix: b (failed -> passed): passed msg" in lines
    assert "  new: fresh (- -> failed): failed msg" in lines and "  removed: gone (passed -> -)" in lines
    assert "  changed: e (xfailed -> xpassed): xpassed msg" in lines


def with_tables(report, exits):
    return {**report, "performance": [{"benchmark": name, "exit": status, "arguments": [],
                                       "output": f"zero  ratio\n{name} verdict (exit {status})\n"}
                                      for name, status in exits.items()]}


def test_diff_compares_the_benchmark_tables_by_their_verdicts(tmp_path):
    old = with_tables(report_with({"a": "passed"}), {"step_overhead": 0, "collectives": 1, "gone": 0, "same": 0})
    new = with_tables(report_with({"a": "passed"}), {"step_overhead": 1, "collectives": 0, "fresh": 0, "same": 0})
    for name, report in (("old", old), ("new", new), ("unbenchmarked", report_with({"a": "passed"}))):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))

    def diff(before, after):
        return subprocess.run([sys.executable, "-m", "harness", "diff", str(tmp_path / f"{before}.json"),
                               str(tmp_path / f"{after}.json")], cwd=REPO, capture_output=True, text=True,
                              timeout=120)

    proc = diff("old", "new")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("1 regressions, 1 fixes, 1 new, 1 removed, 0 changed")
    assert "  regression: performance/step_overhead (met -> missed): step_overhead verdict (exit 1)" in lines
    assert "  fix: performance/collectives (missed -> met): collectives verdict (exit 0)" in lines
    assert "  new: performance/fresh (- -> met): fresh verdict (exit 0)" in lines
    assert "  removed: performance/gone (met -> -)" in lines
    # A run no bench ran on says nothing about performance: no table is listed as removed.
    proc = diff("old", "unbenchmarked")
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].endswith("0 removed, 0 changed"), proc.stdout
    (tmp_path / "bad.json").write_text(json.dumps({**report_with({"a": "passed"}), "performance": [{"exit": 0}]}))
    proc = diff("old", "bad")
    assert proc.returncode == 2 and "performance section is not one harness bench wrote" in proc.stderr


@pytest.mark.parametrize("content, reason", [(None, "does not exist"), ("{", "is not a report.json"),
                                             ('{"schema_version": 9}', "is not a report.json of schema version 1")])
def test_diff_of_something_that_is_not_a_report_is_one_line(tmp_path, content, reason):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report_with({"a": "passed"})))
    proc = subprocess.run([sys.executable, "-m", "harness", "diff", str(bad), str(good)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and reason in proc.stderr


def test_tolerance_rows_per_device():
    from harness.training.loss_comparison import tolerance
    assert tolerance("fp32", "CPU") == (1e-5, 1e-6)
    assert tolerance("fp32", "TPU") == (1e-4, 1e-5)  # compared at DS_XLA_MATMUL_PRECISION=highest
    assert tolerance("bf16", "TPU") == tolerance("bf16", "CPU")


def test_a_run_whose_last_check_crashed_its_process_is_complete(tmp_path):
    """The crashed check is recorded by the orchestrator; its session never wrote that it finished."""
    ids = [f"{DEVICE}::test_synchronize[None]", f"{DEVICE}::test_on_accelerator"]
    write_parts(tmp_path, [{"event": "collected", "ids": ids}, {"event": "start", "id": ids[0]},
                           result(ids[0], "passed", "synchronize"), {"event": "start", "id": ids[1]},
                           result(ids[1], "error", "on_accelerator", message="the check's process ended")],
                finished=False)
    report = finish(tmp_path, child_rc=0)
    assert report["complete"] and report["summary"]["error"] == 1


def test_an_unfinished_session_with_a_check_left_is_incomplete(tmp_path):
    ids = [f"{DEVICE}::test_synchronize[None]", f"{DEVICE}::test_on_accelerator"]
    write_parts(tmp_path, [{"event": "collected", "ids": ids}, {"event": "start", "id": ids[0]},
                           result(ids[0], "passed", "synchronize")], finished=False)
    assert finish(tmp_path, child_rc=-9)["complete"] is False


def _bench_setup(tmp_path, monkeypatch, benchmarks):
    """A finished run's directory, and a benchmarks/ folder of `benchmarks` ({name: script text}) that
    `harness bench` runs instead of the repository's."""
    run_dir, folder = tmp_path / "run", tmp_path / "benchmarks"
    folder.mkdir()
    for name, text in benchmarks.items():
        (folder / f"{name}.py").write_text(text)
    write_parts(run_dir, [result(f"{DEVICE}::t", "passed", "synchronize")])
    finish(run_dir, child_rc=0)
    monkeypatch.setattr(bench_command, "BENCHMARKS", folder)
    return run_dir


def test_bench_adds_its_tables_to_a_runs_report(tmp_path, monkeypatch):
    run_dir = _bench_setup(tmp_path, monkeypatch, {"ratio_table": (
        "print('zero  ratio')\nprint('1     3.20x')\nprint('missed: zero1')\nraise SystemExit(1)\n")})
    assert cli.main(["bench", "--only", "ratio_table", "--report", str(run_dir)]) == 1
    report = json.loads((run_dir / "report.json").read_text())
    [table] = report["performance"]
    assert {key: table[key] for key in ("benchmark", "exit", "output", "arguments")} == {
        "benchmark": "ratio_table", "exit": 1, "output": "zero  ratio\n1     3.20x\nmissed: zero1\n", "arguments": []}
    assert table["revision"] == environment.git_revision(REPO) and table["recorded"][:4].isdigit()
    md = (run_dir / "report.md").read_text()
    shown = table["revision"][:12] + ("+dirty" if table["revision"].endswith("+dirty") else "")  # a work tree's edits show
    assert "### Performance" in md and f"({table['recorded']}, {shown}): missed a target or failed" in md
    assert "1     3.20x" in md
    assert cli.main(["bench", "--only", "ratio_table", "--report", str(tmp_path / "nowhere")]) == 2


def test_bench_passes_arguments_after_a_double_dash_to_the_one_benchmark_named(tmp_path, monkeypatch, capsys):
    run_dir = _bench_setup(tmp_path, monkeypatch, {"echo": "import sys\nprint('args', *sys.argv[1:])\n"})
    assert cli.main(["bench", "--only", "echo", "--report", str(run_dir), "--", "--only", "1-fp32-1", "--no-cpu"]) == 0
    [table] = json.loads((run_dir / "report.json").read_text())["performance"]
    assert table["output"] == "args --only 1-fp32-1 --no-cpu\n" and table["arguments"] == ["--only", "1-fp32-1", "--no-cpu"]
    assert "`echo` (--only 1-fp32-1 --no-cpu, " in (run_dir / "report.md").read_text()
    capsys.readouterr()
    assert cli.main(["bench", "--", "--no-cpu"]) == 2  # which benchmark they are for is not said
    assert "need --only NAME" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "not-a-report", "another-tools-report", "foreign-performance",
                                    "report-md-is-a-directory", "empty-path"])
def test_bench_refuses_a_report_it_cannot_extend_before_running_anything(tmp_path, monkeypatch, capsys, damage):
    ran = tmp_path / "ran"
    run_dir = _bench_setup(tmp_path, monkeypatch, {"table": f"open({str(ran)!r}, 'w')\nprint('1.00x')\n"})
    report_json, report_md = run_dir / "report.json", run_dir / "report.md"
    if damage == "truncated":
        report_json.write_text(report_json.read_text()[:200])
    elif damage == "not-a-report":
        report_json.write_text("{}")
    elif damage == "another-tools-report":
        report_json.write_text('{"summary": {}, "results": []}')
    elif damage == "foreign-performance":
        report_json.write_text(json.dumps({**json.loads(report_json.read_text()), "performance": "fast"}))
    elif damage == "report-md-is-a-directory":
        report_md.unlink()
        report_md.mkdir()
    before = {path.name: path.read_text() for path in (report_json, report_md) if path.is_file()}
    assert cli.main(["bench", "--report", "" if damage == "empty-path" else str(run_dir)]) == 2
    assert not ran.exists(), "the benchmark ran although its tables had nowhere to go"
    assert {path.name: path.read_text() for path in (report_json, report_md) if path.is_file()} == before
    assert capsys.readouterr().err.count("harness: error: --report") == 1


def test_a_benchmark_that_refuses_its_arguments_adds_no_table(tmp_path, monkeypatch, capsys):
    run_dir = _bench_setup(tmp_path, monkeypatch, {"table": (
        "import sys\nif sys.argv[1:]:\n    print('table.py: error: unrecognized arguments', file=sys.stderr)\n"
        "    sys.exit(2)\nprint('1.00x')\n")})
    assert cli.main(["bench", "--only", "table", "--report", str(run_dir)]) == 0
    before = {name: (run_dir / name).read_text() for name in ("report.json", "report.md")}
    capsys.readouterr()
    assert cli.main(["bench", "--only", "table", "--report", str(run_dir), "--", "--bogus"]) == 2
    assert {name: (run_dir / name).read_text() for name in ("report.json", "report.md")} == before
    assert "benchmarks/table.py stopped with a usage error (exit 2, above)" in capsys.readouterr().err


def test_an_interrupted_bench_stops_its_benchmark_and_keeps_the_finished_tables(tmp_path, monkeypatch, capsys):
    outlived = tmp_path / "outlived"
    run_dir = _bench_setup(tmp_path, monkeypatch, {
        "a_finishes": "print('a 1.00x')\n",
        # a SIGTERM to the harness (a cancelled CI job) while this one runs; it must not get to write its file
        "b_interrupted": ("import os, signal, time\nprint('b started', flush=True)\n"
                          f"os.kill(os.getppid(), signal.SIGTERM)\ntime.sleep(30)\nopen({str(outlived)!r}, 'w')\n")})
    assert cli.main(["bench", "--report", str(run_dir)]) == 130
    assert not outlived.exists()
    assert [t["benchmark"] for t in json.loads((run_dir / "report.json").read_text())["performance"]] == ["a_finishes"]
    assert "harness: bench interrupted during b_interrupted" in capsys.readouterr().err


def test_a_report_that_fails_to_render_leaves_its_files_as_they_were(tmp_path):
    write_parts(tmp_path, [result(f"{DEVICE}::t", "passed", "synchronize")])
    report = finish(tmp_path, child_rc=0)
    before = {name: (tmp_path / name).read_text() for name in ("report.json", "report.md")}
    del report["summary"]  # report.md cannot be rendered without it
    with pytest.raises(KeyError):
        report_files.rewrite_summaries(report, tmp_path)
    assert {name: (tmp_path / name).read_text() for name in ("report.json", "report.md")} == before
