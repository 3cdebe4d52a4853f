"""Candidate specs and suites: pure logic, no device (the interface checklist: test_harness_checklist.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import deepspeed_source_layout, last_json

from harness.candidate.candidate_env import child_env
from harness.candidate.candidates import SpecError, parse_spec
from harness.session import suites

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, kind, name", [
    ("deepspeed_xla", "deepspeed_xla", "deepspeed_xla"),
    ("in-tree", "in-tree", "in-tree"),
    ("in-tree:tpu", "in-tree", "in-tree-tpu"),
    ("my_pkg.accel:MyAccel", "module", "my_pkg.accel.MyAccel"),
    ("tests/candidates/synchronize_noop.py:SynchronizeNoop", "file", "synchronize_noop.SynchronizeNoop"),
])
def test_parse_spec(text, kind, name):
    spec = parse_spec(text)
    assert (spec.kind, spec.name) == (kind, name)


def test_file_spec_is_absolute_for_child_processes():
    spec = parse_spec("tests/candidates/synchronize_noop.py:SynchronizeNoop")
    assert Path(spec.target).is_absolute() and spec.canonical == f"{spec.target}:SynchronizeNoop"


@pytest.mark.parametrize("text, reason", [
    ("", "names no class"),
    ("deepspeed", "names no class"),
    (":Accel", "names no module or file before ':'"),
    ("pkg.mod:", "'' is not a class name"),
    ("pkg.mod:not-a-name", "'not-a-name' is not a class name"),
    ("pkg..mod:Accel", "'pkg..mod' is not a module name"),
    ("some/dir:Accel", "a file candidate must be a .py file"),
    ("in-tree:not a name", "'not a name' is not an accelerator name"),
])
def test_parse_spec_errors_are_one_line(text, reason):
    with pytest.raises(SpecError) as error:
        parse_spec(text)
    assert reason in str(error.value) and "\n" not in str(error.value)


def test_child_env_activates_only_deepspeed_xla_at_start_up():
    base = {"DS_ACCELERATOR": "xla", "PATH": "/bin"}
    assert child_env(parse_spec("deepspeed_xla"), base)["DS_ACCELERATOR"] == "xla"
    for text in ("in-tree", "pkg.mod:Accel"):
        env = child_env(parse_spec(text), base)
        assert "DS_ACCELERATOR" not in env and env["HARNESS_CANDIDATE"] == text and env["PATH"] == "/bin"


@pytest.mark.parametrize("argv, reason", [
    (["run", "--backend", "cpu", "--suite", "nope"], "unknown suite 'nope'"),
    (["run", "--backend", "gpu"], "invalid choice: 'gpu'"),
    (["run", "--backend", "cpu", "--candidate", "foo"], "candidate 'foo' names no class"),
    (["run"], "the following arguments are required: --backend"),
    (["upstream", "--deepspeed-src", "/nonexistent"], "not a DeepSpeed source checkout (no tests/unit/common.py"),
    (["upstream", "--deepspeed-src", "tests/upstream_tree", "--selection", "nope.toml"],
     "selection file nope.toml does not exist (available: deepspeed-0.19.8.toml)"),
])
def test_bad_usage_exits_2_with_one_line(argv, reason):
    proc = subprocess.run([sys.executable, "-m", "harness", *argv], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and reason in proc.stderr and proc.stdout == ""


def test_suites_select_modules_by_area(tmp_path):
    for name in ("test_interface_device.py", "test_zero_stage3.py", "test_zero.py", "test_zeroish.py", "helpers.py"):
        (tmp_path / name).write_text("")
    assert [p.name for p in suites.modules_for("zero", tmp_path)] == ["test_zero.py", "test_zero_stage3.py"]
    assert [p.name for p in suites.modules_for("all", tmp_path)] == [
        "test_interface_device.py", "test_zero.py", "test_zero_stage3.py"]
    with pytest.raises(suites.UnknownSuite, match="known suites: all, checkpoint"):
        suites.modules_for("zero3", tmp_path)


def test_test_ids_match_with_star_only():
    assert suites.id_matches("*[zero2-fp32-1rank]", "test_zero_equivalence.py::test_x[zero2-fp32-1rank]")
    assert not suites.id_matches("*[zero2-fp32-1rank]", "test_zero_equivalence.py::test_x[zero2-fp32-2rank]")
    assert not suites.id_matches("*[ab]", "test_m.py::test_x[a]"), "[ab] read as a character set"


def _conformance_ids():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.session.plugin", "-p", "no:cacheprovider",
                           "--collect-only", "-q", "conformance"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line.split("/", 1)[1] for line in proc.stdout.splitlines() if line.startswith("conformance/")]


def test_smoke_suite_runs_some_but_not_all_checks_of_every_area():
    ids = _conformance_ids()
    for area in suites.AREAS:
        of_area = [i for i in ids if suites.area_of_module(i.split("::")[0]) == area]
        chosen = [i for i in of_area if suites.selects("smoke", i)]
        assert chosen, f"the smoke suite runs no check of area {area!r}: SMOKE[{area!r}] matches none of {of_area[:5]}..."
        for pattern in suites.SMOKE[area]:
            assert any(suites.id_matches(pattern, i) for i in of_area), f"SMOKE[{area!r}] pattern {pattern!r} matches nothing"
    assert sum(suites.selects("smoke", i) for i in ids) < len(ids)


def test_standard_suite_leaves_to_the_nightly_only_what_its_table_names_and_keeps_the_smoke_checks():
    ids = _conformance_ids()
    standard = [i for i in ids if suites.selects("standard", i)]
    left_out = set(ids) - set(standard)
    for area, entries in suites.NIGHTLY.items():
        of_area = [i for i in ids if suites.area_of_module(i.split("::")[0]) == area]
        for pattern, kept_by in entries.items():
            matched = [i for i in of_area if suites.id_matches(pattern, i)]
            assert matched, f"NIGHTLY[{area!r}] pattern {pattern!r} matches no check"
            assert kept_by, f"NIGHTLY[{area!r}][{pattern!r}] names no check that keeps its capability"
        assert set(of_area) - left_out, f"the standard suite runs no check of area {area!r}"
    assert 0 < len(left_out) <= len(ids) // 10, f"the standard suite leaves {len(left_out)} of {len(ids)} checks out"
    smoke_left_out = [i for i in ids if suites.selects("smoke", i) and i in left_out]
    assert not smoke_left_out, f"smoke checks the standard suite leaves out: {smoke_left_out}"
    assert all(suites.selects("all", i) for i in ids)
    assert suites.left_out_by("standard", left_out.pop()).startswith("left to suite all (nightly)")


def test_selective_suites_drop_expectations_they_cannot_match():
    assert suites.may_select("smoke", "conformance/test_zero_equivalence.py::test_z[zero2-fp32-1rank]")
    assert not suites.may_select("smoke", "conformance/test_zero_equivalence.py::test_z[zero1-fp32-2rank]")
    assert suites.may_select("zero", "conformance/test_zero_equivalence.py::test_z[zero1-fp32-2rank]")
    assert not suites.may_select("standard", "conformance/test_zero_equivalence.py::test_z[zero1-fp32-2rank]")
    assert suites.may_select("standard", "conformance/test_zero_equivalence.py::test_z[zero1-bf16-2rank]")


def test_missing_dependencies_exit_2_with_one_line(tmp_path):
    # an interpreter without the harness's dependencies (a bare venv, no site-packages of this stack)
    import venv
    venv.create(tmp_path / "bare", with_pip=False)
    proc = subprocess.run([str(tmp_path / "bare" / "bin" / "python"), "-m", "harness", "run", "--backend", "cpu"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not installed; install the harness's dependencies with `pip install -e " in lines[0], (
        proc.stderr)


def test_in_tree_candidate_is_deepspeeds_own_and_leaves_ds_accelerator_to_the_harness():
    """in-tree:NAME installs what DeepSpeed itself answers to DS_ACCELERATOR=NAME (here its CPU
    accelerator, which every DeepSpeed has), and children do not inherit the name: deepspeed_xla's
    start-up hook would otherwise claim DS_ACCELERATOR=xla in them."""
    code = ("import os; from harness.candidate.candidate_env import install_current; a = install_current(); "
            "print(type(a).__module__, os.environ.get('DS_ACCELERATOR'))")
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**env, "HARNESS_CANDIDATE": "in-tree:cpu"})
    assert proc.stdout.split()[-2:] == ["deepspeed.accelerator.cpu_accelerator", "None"], proc.stderr[-2000:]


@pytest.mark.parametrize("candidate", ["in-tree:cpu", "tests/candidates/synchronize_noop.py:SynchronizeNoop"])
def test_a_deepspeed_source_layout_gets_the_candidate_in_both_copies_of_its_accelerator_module(tmp_path, candidate):
    """DeepSpeed's tests run in its source layout, where the op builders load real_accelerator a second time as the
    top-level `accelerator.real_accelerator`: the candidate must be DeepSpeed's accelerator there too, or DeepSpeed's
    op lookups run on an accelerator of their own choosing (its CPU accelerator here)."""
    code = textwrap.dedent("""
        import json, sys
        from harness.candidate.candidate_env import install_current
        accelerator = install_current()
        import deepspeed.ops
        deepspeed.ops.__compatible_ops__
        first, copy = sys.modules["deepspeed.accelerator.real_accelerator"], sys.modules.get("accelerator.real_accelerator")
        print(json.dumps({"copy_loaded": copy is not None,
                          "same": copy is not None and copy.get_accelerator() is accelerator,
                          "same_list": copy is not None and copy.SUPPORTED_ACCELERATOR_LIST == first.SUPPORTED_ACCELERATOR_LIST}))
    """)
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**env, **deepspeed_source_layout(tmp_path), "HARNESS_CANDIDATE": candidate})
    assert last_json(proc) == {"copy_loaded": True, "same": True, "same_list": True}, proc.stderr[-2000:]
