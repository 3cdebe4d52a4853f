"""Stored reference curves (harness/training/references.py): every training case has one, fresh for the
installed stack, and it is what the CPU accelerator trains today; a stale or damaged one is
named and replaced by a live run; `python -m harness references` records them."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO
from harness.training import references
from harness.training.loss_comparison import compare_losses
from harness.training.training_cases import training_areas, training_cases

CASES = [case for area in training_areas() for case in training_cases(area)]
# the cheapest case (one rank, ~10 s on CPU) stands for all in the checks that train
CHEAP = next(case for case in CASES if case.id == "zero0-fp32-1rank")


def test_every_training_case_has_a_fresh_stored_reference():
    stale = [f"{case.area}/{case.id}: {'; '.join(reasons)}" for case in CASES
             for reasons in [references.load(case)[1]] if reasons]
    assert not stale, (f"{len(stale)} of {len(CASES)} stored CPU references cannot be used (run `tox -e reference` "
                       "and commit fixtures/references/):\n" + "\n".join(stale))


def test_no_stored_reference_without_a_case():
    known = {references.path_for(case) for case in CASES}
    orphans = sorted(str(p.relative_to(REPO)) for p in references.REFERENCES.rglob("*.json") if p not in known)
    assert not orphans, f"stored references for no case in fixtures/training_cases.toml: {orphans}; delete them"


def test_areas_that_compare_other_runs_take_no_reference():
    for area in ("checkpoint", "graph"):  # resumed vs uninterrupted run; graph counts vs a hand-written loop
        assert training_cases(area) and area not in training_areas(), area
        assert not (references.REFERENCES / references.BACKEND / area).exists(), area


def test_an_area_table_holds_its_cases_defaults_and_its_own_fields(tmp_path):
    table = tmp_path / "training_cases.toml"
    table.write_text("""
[curves]
script = "train.py"
steps = 4

[curves.cases.one]
config = "configs/zero0.json"
precision = "fp32"
ranks = 1
args = ["--style", "parameters"]

[resumes]
reference = false
script = "train.py"
steps = 6
save_after = 3
precision = "fp32"
ranks = 2

[resumes.cases.zero2]
config = "configs/zero2.json"

[resumes.cases.zero3]
config = "configs/zero3.json"
steps = 8
""")
    assert training_areas(table) == ["curves"]
    [one] = training_cases("curves", table)
    assert (one.script, one.steps, one.args, one.area_fields) == ("train.py", 4, ("--style", "parameters"), {})
    zero2, zero3 = training_cases("resumes", table)
    assert (zero2.id, zero2.ranks, zero2.steps, zero2.area_fields) == ("zero2", 2, 6, {"save_after": 3})
    assert (zero3.steps, zero3.area_fields) == (8, {"save_after": 3})


def test_a_reference_config_is_what_the_reference_trains_and_part_of_its_provenance(monkeypatch):
    qwz = next(case for case in CASES if case.reference_config)
    assert qwz.reference_config in qwz.sources and qwz.config in qwz.sources
    assert references.provenance(qwz)["case"]["reference_config"] == qwz.reference_config
    assert "reference_config" not in references.provenance(CHEAP)["case"]
    trained = []
    monkeypatch.setattr("harness.training.training.run_training",
                        lambda script, config, candidate, workdir, **kw: trained.append((config.name, candidate)))
    qwz.run(None, "unused")
    qwz.run("the candidate", "unused")
    assert trained == [(Path(qwz.reference_config).name, None), (Path(qwz.config).name, "the candidate")]


def _provenance():
    return {"case": {"script": "train.py", "config": "configs/zero0.json", "ranks": 1, "steps": 4, "args": []},
            "sources": {"train.py": "a" * 64, "configs/zero0.json": "b" * 64},
            "stack": {"torch": "2.9.0", "deepspeed": "0.19.8", "deepspeed_git": None}}


@pytest.mark.parametrize("section,field,value,reason", [
    ("case", "ranks", 2, "case ranks is 1, recorded with 2"),
    ("case", "args", ["--activation-checkpointing"], "case args is [], recorded with ['--activation-checkpointing']"),
    ("sources", "configs/zero0.json", "c" * 64, "fixtures/configs/zero0.json changed since it was recorded"),
    ("stack", "deepspeed", "0.19.7", "deepspeed is 0.19.8, recorded with 0.19.7"),
    ("stack", "deepspeed_git", "0123abc", "deepspeed_git is None, recorded with 0123abc"),
])
def test_staleness_names_what_changed(section, field, value, reason):
    stored = _provenance()
    stored[section][field] = value
    assert references.staleness(stored, _provenance()) == [reason]
    assert references.staleness(_provenance(), _provenance()) == []


def test_fresh_stored_curve_is_used_without_training(tmp_path):
    made_up = [3.0, 2.0, 1.5, 1.25]  # no training run produces these: seeing them proves nothing trained
    references.record(CHEAP, made_up, root=tmp_path)
    reference = references.reference_for(CHEAP, "stored", tmp_path / "work", root=tmp_path)
    assert (reference.source, reference.losses, reference.note) == ("stored", made_up, "")
    assert not (tmp_path / "work").exists(), "a fresh stored reference must not start a training run"


@pytest.mark.parametrize("damage,reason", [
    (lambda record: record["stack"].update(deepspeed="0.0.1"), "deepspeed is 0.19.8, recorded with 0.0.1"),
    (lambda record: record.update(losses=record["losses"][:2]), "holds 2 losses, the case trains 4 steps"),
    (lambda record: record.pop("sources"), "is not a reference record (KeyError"),
])
def test_unusable_stored_curve_is_named(tmp_path, damage, reason):
    path = references.record(CHEAP, [3.0, 2.0, 1.5, 1.25], root=tmp_path)
    record = json.loads(path.read_text())
    damage(record)
    path.write_text(json.dumps(record))
    assert any(reason in line for line in references.load(CHEAP, root=tmp_path)[1])


def test_stale_stored_curve_is_trained_live(tmp_path):
    path = references.record(CHEAP, [3.0, 2.0, 1.5, 1.25], root=tmp_path)
    path.write_text(path.read_text().replace('"deepspeed": "', '"deepspeed": "0.0.1-was-'))
    reference = references.reference_for(CHEAP, "stored", tmp_path / "work", root=tmp_path)
    assert reference.source == "live" and "computed live: deepspeed is" in reference.note, reference.note
    _assert_matches_committed(reference.losses, "trained live")


def test_live_mode_trains_and_measures_the_stored_curve(tmp_path):
    references.record(CHEAP, [3.0, 2.0, 1.5, 1.25], root=tmp_path)
    reference = references.reference_for(CHEAP, "live", tmp_path / "work", root=tmp_path)
    assert reference.source == "live" and reference.note == ""
    _assert_matches_committed(reference.losses, "trained live")
    # the made-up stored curve is far from what CPU training gives: the evidence says by how much
    expected = compare_losses([3.0, 2.0, 1.5, 1.25], reference.losses, CHEAP.precision)["max_rel_err"]
    assert reference.evidence()["stored_max_rel_diff"] == expected > 1, reference.evidence()


def _assert_matches_committed(losses, how):
    """CPU training today must still reproduce the committed stored curve (within the case's tolerance)."""
    comparison = compare_losses(references.load(CHEAP)[0]["losses"], losses, CHEAP.precision)
    assert comparison["ok"], f"{how}, {CHEAP.id} differs from fixtures/references: {comparison}"


def test_regenerating_names_a_failed_case_and_leaves_an_unchanged_curve_alone(tmp_path):
    broken = dataclasses.replace(CHEAP, id="missing-config", config="configs/no_such_config.json")
    committed = references.path_for(CHEAP)
    kept = references.path_for(CHEAP, root=tmp_path)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(committed.read_bytes())
    lines = []
    failed = references.regenerate([broken, CHEAP], tmp_path / "work", root=tmp_path, say=lines.append)
    assert failed == [broken] and not references.path_for(broken, root=tmp_path).exists()
    first = lines[0].splitlines()[0]
    assert first.startswith("zero/missing-config: FAILED, nothing recorded: train.py with no_such_config.json "
                            "on 1 rank(s), the CPU reference, exited 1 (") and first.endswith("; log tail:"), first
    assert "no_such_config.json" in first.split("exited 1")[1], f"the first line must say what went wrong: {first}"
    # the failure did not stop the next case, whose curve trained the same (bit for bit, or within CPU
    # rounding when this machine's CPU differs from the recording one) and was not rewritten
    assert lines[1].startswith(f"zero/{CHEAP.id}: unchanged ({kept}"), lines[1]
    assert kept.read_bytes() == committed.read_bytes()


def _references_command(*args):
    return subprocess.run([sys.executable, "-m", "harness", "references", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def test_references_command_records_a_case(tmp_path):
    proc = _references_command("-k", CHEAP.id, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = references.path_for(CHEAP, root=tmp_path)
    assert f"zero/{CHEAP.id}: 4 losses -> {written}; new" in proc.stdout, proc.stdout
    assert "harness: 1 trained, 0 failed" in proc.stdout, proc.stdout
    stored, reasons = references.load(CHEAP, root=tmp_path)
    assert reasons == [] and stored["recorded_on"]["machine"]
    _assert_matches_committed(stored["losses"], "recorded again")


@pytest.mark.parametrize("args,message", [
    (["-k", "no-such-case"], "no training case id contains 'no-such-case'"),
    (["--area", "graph"], "argument --area: invalid choice: 'graph'"),
    (["--area", "checkpoint"], "argument --area: invalid choice: 'checkpoint'"),
])
def test_references_command_bad_usage(args, message, tmp_path):
    proc = _references_command(*args, "--out", str(tmp_path))  # a usage that is not refused writes nothing here
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"harness: error: {message}"), proc.stderr
