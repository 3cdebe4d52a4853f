"""The interface checklist (harness/session/checklist.py): the method a check covers, by its covers marker
or by its name, and what coverage counts; then the plugin tagging a real pytest session by them."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.session import checklist

REPO = Path(__file__).resolve().parents[1]
METHODS = ["Stream", "device_count", "is_available", "max_memory_allocated", "memory_allocated", "stream"]


def test_checklist_covers_abstract_methods_and_public_hooks():
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
    methods = checklist.interface_methods()
    assert set(DeepSpeedAccelerator.__abstractmethods__) <= set(methods)
    assert {"pin_memory", "is_pinned", "pin_empty", "is_fp64_supported"} <= set(methods)
    assert not any(m.startswith("_") for m in methods)


@pytest.mark.parametrize("test_name, method", [
    ("test_memory_allocated", "memory_allocated"),
    ("test_max_memory_allocated[int]", "max_memory_allocated"),
    ("test_memory_allocated__grows_with_tensors", "memory_allocated"),
    ("test_Stream", "Stream"),
    ("test_stream", "stream"),
    ("test_nothing_like_a_method", None),
    ("check_memory_allocated", None),
])
def test_method_of(test_name, method):
    assert checklist.method_of(test_name, METHODS) == method


@pytest.mark.parametrize("test_name, covers, method", [
    ("test_device_count", [], "device_count"),  # no marker: the name rule
    ("test_device_count__in_a_fresh_process[int]", [], "device_count"),
    ("test_peak_at_least_current[max_memory_allocated]", ["max_memory_allocated"], "max_memory_allocated"),
    ("test_device_count", ["is_available"], "is_available"),  # a marker replaces the name rule
    ("test_probe", ["device_count", "device_count"], "device_count"),  # the same marker twice (module and param)
])
def test_covered_method(test_name, covers, method):
    assert checklist.covered_method(test_name, covers, METHODS) == method


@pytest.mark.parametrize("test_name, covers, reason", [
    ("test_probe", [], "names no method of DeepSpeedAccelerator; name it test_<method> or test_<method>__<aspect>, "
                       "or mark it @pytest.mark.covers(<method>)"),
    ("test_probe", ["device_cont"], "covers 'device_cont', which DeepSpeedAccelerator does not define "
                                    "(did you mean 'device_count'?)"),
    # a wrong name is never dropped for the name rule
    ("test_device_count", ["no_such_method"], "covers 'no_such_method', which DeepSpeedAccelerator does not define"),
    ("test_probe", ["device_count", "is_available"], "covers 'device_count', 'is_available'; a check covers one method: "
                                                     "parametrize it with one pytest.param marked covers(<method>) per method"),
])
def test_covered_method_says_why_a_check_covers_nothing(test_name, covers, reason):
    with pytest.raises(checklist.ChecklistError) as error:
        checklist.covered_method(test_name, covers, METHODS)
    assert str(error.value) == reason


@pytest.mark.parametrize("test_name, method", [
    ("test_memory_allocated__grows_with_tensors[int]", "memory_allocated"),  # the name rule first
    ("test_peak_at_least_current[max_memory_allocated]", "max_memory_allocated"),  # a covering param's id
    ("test_peak_at_least_current[int]", None),
])
def test_method_of_a_lost_check_by_its_id(test_name, method):
    assert checklist.method_of_test_id(test_name, METHODS) == method


def test_coverage_lists_unchecked_methods():
    assert checklist.coverage(["a", "b", "c"], {"a", "c", "not-a-method", None}) == {
        "total": 3, "checked": 2, "unchecked": ["b"]}


def test_plugin_tags_interface_checks_by_their_covers_markers(tmp_path):
    """A pytest session with the harness plugin on a stand-in conformance module: every check is
    tagged with what it covers, and a check whose marker names no method fails, saying so."""
    module = tmp_path / "test_interface_stand_in.py"
    module.write_text(textwrap.dedent("""
        import pytest

        pytestmark = pytest.mark.area("interface")


        @pytest.mark.covers("is_available")
        def test_probe():
            pass


        @pytest.mark.covers("device_count", "is_available")
        def test_two_methods():
            pass


        @pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.covers(name), id=name)
                                          for name in ("Stream", "Strem")])
        def test_constructor(name):
            pass


        def test_stream__by_its_name():
            pass
    """))
    elsewhere = tmp_path / "test_collectives_stand_in.py"
    elsewhere.write_text(textwrap.dedent("""
        import pytest

        pytestmark = pytest.mark.area("collectives")


        @pytest.mark.covers("device_count")
        def test_all_reduce():
            pass
    """))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.session.plugin", "-p", "no:cacheprovider",
                           "--harness-out", str(out), str(module), str(elsewhere)], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    records = [json.loads(line) for line in (out / "parts" / "results.jsonl").read_text().splitlines()]
    results = {r["id"].split("::", 1)[1]: r for r in records if r["event"] == "result"}
    assert {name: (r["status"], r["method"]) for name, r in results.items()} == {
        "test_probe": ("passed", "is_available"),
        "test_two_methods": ("error", None),
        "test_constructor[Stream]": ("passed", "Stream"),
        "test_constructor[Strem]": ("error", None),
        "test_stream__by_its_name": ("passed", "stream"),
        "test_all_reduce": ("error", None),
    }, proc.stdout[-3000:]
    assert results["test_constructor[Strem]"]["message"] == (
        "error in setup: Failed: interface check test_constructor[Strem] covers 'Strem', which DeepSpeedAccelerator does "
        "not define (did you mean 'Stream'?)")
    assert results["test_all_reduce"]["message"] == (
        "error in setup: Failed: test_all_reduce is a collectives check; pytest.mark.covers marks interface checks")
