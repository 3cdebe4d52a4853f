"""`python -m harness upstream` on a small tests tree shaped like DeepSpeed's (tests/upstream_tree/):
verdicts, report rows, selection matching, stale entries, and a bounded time for a rank that dies
or a test that hangs. The real DeepSpeed checkout is not available to CI; the tree stands in."""

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import psutil
import pytest

from harness.session import expectations
from harness.upstream import upstream_run, upstream_selection, upstream_verdicts
from harness.upstream.upstream import checkout_version, same_release

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "tests" / "upstream_tree"
BASICS = "unit/comm/test_accelerator_basics.py"


@pytest.fixture
def tree(tmp_path):
    """A private copy: its path marks every process of the run, so none may outlive it. Its version.txt is the
    installed DeepSpeed's, as a checkout of the installed release has."""
    copy = tmp_path / "deepspeed"
    shutil.copytree(TREE, copy)
    (copy / "version.txt").write_text(f"{metadata.version('deepspeed')}\n")
    return copy


def processes_under(path):
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(str(path) in part for part in process.info["cmdline"] or ()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def upstream(tmp_path, tree, *args):
    out = tmp_path / "run"
    env = {**os.environ, "HARNESS_REPORTS_DIR": str(tmp_path / "reports")}
    proc = subprocess.run([sys.executable, "-m", "harness", "upstream", "--deepspeed-src", str(tree),
                           "--selection", str(tree / "selection.toml"), "--out", str(out), "--timeout", "20", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return proc, report, out


@pytest.mark.parametrize("version_txt, refused", [
    (b"0.19.6\n", "is DeepSpeed 0.19.6 (version.txt) but {installed} is installed"),
    (b"{installed}rc1", "is DeepSpeed {installed}rc1 (version.txt) but {installed} is installed"),
    (b"{installed}\nmore", "is DeepSpeed '{installed}\\nmore' (version.txt) but {installed} is installed"),
    (b"  \n", "version.txt is empty, so which DeepSpeed its tests import cannot be told"),
    (b"\xff\xfe{installed}", "version.txt is not UTF-8 text (invalid start byte at byte 0)"),
    (None, "no version.txt, so which DeepSpeed its tests import cannot be told"),
])
def test_a_checkout_of_another_deepspeed_is_refused_in_one_line(tmp_path, tree, version_txt, refused):
    installed = metadata.version("deepspeed")
    if version_txt is None:
        (tree / "version.txt").unlink()
    else:
        (tree / "version.txt").write_bytes(version_txt.replace(b"{installed}", installed.encode()))
    proc, report, out = upstream(tmp_path, tree)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and refused.format(installed=installed) in proc.stderr, proc.stderr
    assert report is None and not out.exists() and proc.stdout == ""


def test_an_editable_install_s_version_names_its_checkout_s_release():
    """`pip install -e` of a checkout reports version.txt plus +<git hash>: the tests import that same code."""
    assert same_release("0.19.8", "0.19.8+1a2b3c4") and same_release("0.19.08", "0.19.8")
    assert same_release("0.19.8.0", "0.19.8") and same_release("v0.19.8", "0.19.8")
    for other in ("0.19.6", "0.19.9.dev0", "0.19.8rc1", "0.19.8.post1", "0.19.7+0.19.8", "main"):
        assert not same_release(other, "0.19.8"), other


def test_version_txt_is_read_as_a_checkout_writes_it(tmp_path):
    (tmp_path / "version.txt").write_bytes(b"\xef\xbb\xbf0.19.8\r\n")  # a byte-order mark, Windows line end
    assert checkout_version(tmp_path) == "0.19.8"
    assert checkout_version(tmp_path / "absent") is None


def verdicts_of(report):
    return {r["id"].split("::", 1)[1]: (r["evidence"]["verdict"], r["status"]) for r in report["results"]}


@pytest.mark.slow
def test_broken_candidate_regresses_where_it_breaks_and_nowhere_else(tmp_path, tree):
    proc, report, out = upstream(tmp_path, tree, "--candidate",
                                 str(REPO / "tests" / "candidates" / "cpu_rng_state.py") + ":CpuRngState")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert verdicts_of(report) == {
        "TestDeviceArithmetic::test_add": ("both-pass", "passed"),
        "TestRngState::test_restore_replays": ("regression", "failed"),
        "TestNeedsDevice::test_not_on_cpu": ("candidate-only-pass", "xpassed"),  # listed in [[known]]
        "TestRankDies::test_rank_killed": ("both-fail", "skipped"),
        "test_runs_in_the_session": ("both-pass", "passed"),
        "test_hangs_when_asked": ("both-pass", "passed"),
    }
    regression = next(r for r in report["results"] if r["evidence"]["verdict"] == "regression")
    assert regression["evidence"]["baseline"] == "passed" and regression["evidence"]["candidate"] == "failed"
    assert "REGRESSION unit/comm/test_accelerator_basics.py::TestRngState::test_restore_replays" in proc.stdout
    # the rank killed by a signal: DeepSpeed-style pool timeout, then the session resumed after it
    died = next(r for r in report["results"] if "TestRankDies" in r["id"])
    assert died["evidence"]["candidate"] == "error" and "Test hanged" in died["evidence"]["candidate_message"]
    assert report["upstream"]["sides"]["candidate"]["sessions"] == 2
    # selection matching: two stale entries, one known difference unmatched, one that now passes
    assert report["upstream"]["stale_selection"] == ["unit/comm/test_removed_upstream.py",
                                                     f"{BASICS} (TestRenamedUpstream)"]
    assert [e["id"] for e in report["expectations"]["unmatched"]] == ["unit/comm/test_gone.py::*"]
    assert report["expectations"]["xpassed"] == [f"{BASICS}::TestNeedsDevice::test_not_on_cpu"]
    assert report["upstream"]["files"][BASICS] == {
        "tests": 6, "expected": 0, "fp16": 0, "regressions": 1,
        "baseline": {"pass": 4, "skip": 1, "fail": 1}, "candidate": {"pass": 4, "fail": 2},
        "verdicts": {"both-pass": 3, "regression": 1, "candidate-only-pass": 1, "both-fail": 1}}
    assert report["upstream"]["total"] == report["upstream"]["files"][BASICS]
    assert report["environment"]["deepspeed_src_version"] == metadata.version("deepspeed") and report["suite"] == "upstream"
    # report.md: the per-file row, no path of this machine, and junit with the area
    markdown = (out / "report.md").read_text()
    assert f"| `{BASICS}` | 6 | 4 | 4 | 0 | 0 | 1 | 4/1/1 | 4/2/0 |" in markdown and str(tree) not in markdown
    assert "| **total** | 6 | 4 | 4 | 0 | 0 | 1 | 4/1/1 | 4/2/0 |" in markdown
    assert 'testsuite name="upstream"' in (out / "junit.xml").read_text()
    assert processes_under(tree) == []


@pytest.mark.slow
def test_deepspeed_xla_passes_what_the_broken_candidate_fails(tmp_path, tree):
    proc, report, _ = upstream(tmp_path, tree, "-k", "RngState or NeedsDevice")
    assert verdicts_of(report) == {"TestRngState::test_restore_replays": ("both-pass", "passed"),
                                   "TestNeedsDevice::test_not_on_cpu": ("candidate-only-pass", "xpassed")}
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["environment"]["env"]["DS_ACCELERATOR"] == "xla"


@pytest.mark.slow
def test_bf16_cases_deepspeed_s_helper_skips_run_on_the_candidate_side_only(tmp_path, tree):
    # DeepSpeed's bf16 helper names the accelerators it knows; on the candidate's side it also answers the
    # candidate's is_bf16_supported(), at collection and inside a rank (harness/upstream/bf16_check.py)
    selection = tmp_path / "bf16.toml"
    selection.write_text("[[tests]]\npath = 'unit/ops/test_bf16_cases.py'\n")
    proc, report, _ = upstream(tmp_path, tree, "--selection", str(selection))
    assert verdicts_of(report) == {"test_bf16_sum_at_collection": ("candidate-only-pass", "passed"),
                                   "TestBf16InRank::test_bf16_product": ("candidate-only-pass", "passed")}, (
        proc.stdout + proc.stderr)
    assert proc.returncode == 0 and processes_under(tree) == []


def test_a_hung_test_is_stopped_in_bounded_time_and_the_run_goes_on(tmp_path, tree):
    env = {**os.environ, "TREE_HANG": "1", "DS_ACCELERATOR": "cpu"}
    said = []
    run = upstream_run.run_side(name="baseline", tests_dir=tree / "tests",
                                targets=[f"{BASICS}::test_hangs_when_asked", f"{BASICS}::test_runs_in_the_session"],
                                pytest_args=[], env=env, workdir=tmp_path, timeout_s=6, say=said.append, grace_s=2)
    # timeout_s also bounds the quiet between tests: 3 s was too tight for a session's start-up on a
    # loaded machine (the passing test's session was stopped and a third one ran it).
    hung = run.results[f"{BASICS}::test_hangs_when_asked"]
    assert hung["status"] == "error" and "did not finish within 8 s" in hung["message"]
    assert run.results[f"{BASICS}::test_runs_in_the_session"]["status"] == "passed", said
    assert run.stopped == [f"{BASICS}::test_hangs_when_asked"] and run.sessions == 2, said
    assert run.seconds < 60 and processes_under(tree) == []


def test_an_entry_with_marks_runs_in_a_session_of_its_own_under_them(tmp_path, tree):
    # the tree's pytest.ini leaves out tests marked inference_ops, as DeepSpeed's does
    path = tmp_path / "selection.toml"
    path.write_text(f"[[tests]]\npath = '{BASICS}'\nids = ['test_runs_in_the_session']\n"
                    "[[tests]]\npath = 'unit/ops/test_marked.py'\nmarks = ' inference_ops '\n")
    groups = upstream_selection.load(path).sessions()
    assert groups == [("", [f"{BASICS}::test_runs_in_the_session"]), ("inference_ops", ["unit/ops/test_marked.py"])]
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    said = []
    run = upstream_run.run_side_sessions(name="baseline", groups=groups, tests_dir=tree / "tests", pytest_args=[],
                                         env=env, workdir=tmp_path, timeout_s=60, say=said.append)
    assert {nodeid: r["status"] for nodeid, r in run.results.items()} == {
        f"{BASICS}::test_runs_in_the_session": "passed", "unit/ops/test_marked.py::test_marked_kernel": "passed"}, said
    assert run.sessions == 2 and (tmp_path / "baseline-2-1.jsonl").is_file()
    # without its marks the entry runs under the tree's default expression, which leaves the marked test out
    plain = upstream_run.run_side_sessions(name="plain", groups=[("", ["unit/ops/test_marked.py"])],
                                           tests_dir=tree / "tests", pytest_args=[], env=env, workdir=tmp_path,
                                           timeout_s=60, say=said.append)
    assert list(plain.results) == ["unit/ops/test_marked.py::test_unmarked"]


@pytest.mark.parametrize("baseline, candidate, verdict, status", [
    ("passed", "passed", "both-pass", "passed"),
    ("skipped", "passed", "candidate-only-pass", "passed"),
    ("failed", "xpassed", "candidate-only-pass", "passed"),
    ("passed", "failed", "regression", "failed"),
    ("passed", "error", "regression", "failed"),
    ("xpassed", "skipped", "candidate-skips", "failed"),
    ("passed", None, "candidate-skips", "failed"),  # not collected on the candidate
    ("skipped", "failed", "candidate-only-fail", "failed"),
    ("failed", "error", "both-fail", "skipped"),
    ("error", "skipped", "baseline-fails", "skipped"),
    ("skipped", "xfailed", "both-skip", "skipped"),
])
def test_verdicts(baseline, candidate, verdict, status):
    record = lambda s: None if s is None else {"status": s, "message": f"{s} here", "duration_s": 1.0}
    result = upstream_verdicts.judge("f.py::t", record(baseline), record(candidate))
    assert (result["evidence"]["verdict"], result["status"]) == (verdict, status)
    assert result["area"] == "upstream"
    if verdict == "regression":
        assert result["message"] == f"candidate {candidate}: {candidate} here"


@pytest.mark.parametrize("text, reason", [
    ("", "selects no tests"),
    ("[[tests]]\nwhy = 'x'\n", "tests #1 lacks path"),
    ("[[tests]]\npath = '/abs/test_x.py'\n", "path must be relative"),
    ("[[tests]]\npath = 'unit/t.py'\nids = 'TestX'\n", "ids must be a list"),
    ("[[tests]]\npath = 'unit/t.py'\n[[known]]\nid = 'unit/t.py::*'\nreason = 'r'\n", "known #1 lacks link"),
    ("[[tests]\n", "not valid TOML"),
    ("[[tests]]\npath = 'unit/t.py'\npr = 'yes'\n", "tests #1: pr must be true or false"),
    ("[[tests]]\npath = 'unit/t.py'\nmarks = 1\n", "tests #1: marks must be a pytest marker expression"),
    ("[[tests]]\npath = 'unit/t.py'\n[[known]]\nid = 'x'\nreason = 'r'\nlink = 'l'\nfp16 = 1\n", "known #1: fp16 must be"),
])
def test_selection_errors_are_one_line(tmp_path, text, reason):
    path = tmp_path / "selection.toml"
    path.write_text(text)
    with pytest.raises(upstream_selection.SelectionError, match=reason) as error:
        upstream_selection.load(path)
    assert "\n" not in str(error.value)


def test_selection_entries_match_node_ids():
    entry = upstream_selection.Entry("unit/a.py", ("TestX", "test_y"))
    assert entry.targets == ["unit/a.py::TestX", "unit/a.py::test_y"]
    assert entry.covers("unit/a.py::TestX::test[1]") and entry.covers("unit/a.py::test_y[p]")
    assert not entry.covers("unit/a.py::TestXL::test") and not entry.covers("unit/b.py::TestX::test")


def test_the_pull_request_subset_is_the_entries_marked_pr(tmp_path):
    path = tmp_path / "selection.toml"
    path.write_text("[[tests]]\npath = 'unit/a.py'\npr = true\n[[tests]]\npath = 'unit/b.py'\n")
    selection = upstream_selection.load(path)
    assert selection.only("all") is selection and selection.only("all").targets == ["unit/a.py", "unit/b.py"]
    assert selection.only("pr").targets == ["unit/a.py"] and selection.only("pr").subset == "pr"
    path.write_text("[[tests]]\npath = 'unit/b.py'\n")
    with pytest.raises(upstream_selection.SelectionError, match="no .*pr = true"):
        upstream_selection.load(path).only("pr")


def test_per_file_counts_what_a_pull_request_quotes():
    fp16 = expectations.Expectation("unit/a.py::TestHalf::*", "fp16 by design", "l")
    other = expectations.Expectation("unit/b.py::t_known", "an XLA limit", "l")
    record = lambda status: {"status": status, "message": "", "duration_s": 0.0}
    results = [upstream_verdicts.judge(nodeid, record(base), record(cand)) for nodeid, base, cand in [
        ("unit/a.py::TestHalf::t", "passed", "failed"), ("unit/a.py::t_ok", "passed", "passed"),
        ("unit/a.py::t_new", "skipped", "passed"), ("unit/b.py::t_known", "passed", "error"),
        ("unit/b.py::t_broken", "passed", "failed"), ("unit/b.py::t_both", "failed", "failed")]]
    expectations.apply(results, [fp16, other])
    files = upstream_verdicts.per_file(results, (fp16,))
    pick = lambda row: {"baseline_passed": row["baseline"].get("pass", 0), "candidate_passed": row["candidate"].get("pass", 0),
                        **{key: row[key] for key in ("tests", "expected", "fp16", "regressions")}}
    assert pick(files["unit/a.py"]) == {"tests": 3, "baseline_passed": 2, "candidate_passed": 2, "expected": 0,
                                        "fp16": 1, "regressions": 0}
    assert pick(files["unit/b.py"]) == {"tests": 3, "baseline_passed": 2, "candidate_passed": 0, "expected": 1,
                                        "fp16": 0, "regressions": 1}
    total = upstream_verdicts.total(files)
    assert pick(total) == {"tests": 6, "baseline_passed": 4, "candidate_passed": 2, "expected": 1, "fp16": 1,
                           "regressions": 1}
    assert total["verdicts"] == {"regression": 3, "both-pass": 1, "candidate-only-pass": 1, "both-fail": 1}


def test_the_shipped_selection_for_the_pinned_deepspeed_loads():
    from importlib import metadata
    selection = upstream_selection.load(upstream_selection.default_path(metadata.version("deepspeed")))
    assert selection.deepspeed == metadata.version("deepspeed")
    assert len(selection.targets) >= 10 and all(k.reason and k.link for k in selection.known)
    # the pull-request subset is a part of it, and fp16 differences are the ones counted apart
    assert 0 < len(selection.only("pr").entries) < len(selection.entries)
    assert selection.fp16_known and all("fp16" in k.reason for k in selection.fp16_known)
