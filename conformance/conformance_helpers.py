"""Helpers shared by conformance checks (not checks themselves): they run things and parametrize
checks; the assertions checks share are in assertions.py."""

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.candidate import candidate_env
from harness.paths import FIXTURES
from harness.training.training_cases import training_cases

# DeepSpeed passes device indices as ints, as strings ("0", from env and configs) and as torch.device.
INDEX_FORMS = {
    "int": lambda i: i,
    "str": lambda i: str(i),
    "device": lambda i: torch.device("xla", i),
}


def covering(method, *values):
    """A pytest.param of a check parametrized over sibling DeepSpeedAccelerator methods: `method`,
    then `values`, with the method as its id, marked as covering it (harness/session/checklist.py)."""
    return pytest.param(method, *values, id=method, marks=pytest.mark.covers(method))


def training_case_params(area, where=lambda case: True):
    """The cases of `area` in fixtures/training_cases.toml for which `where(case)` holds, as pytest parameters,
    each with its id."""
    return [pytest.param(case, id=case.id) for case in training_cases(area) if where(case)]


@functools.cache
def import_fixture_script(script):
    """A fixture script (relative to fixtures/) imported as a module, once per process: what it
    defines (a model, its data, its cases), without running it as a script."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, FIXTURES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host(tensor):
    """Host copy of an XLA tensor (runs its pending graph)."""
    return tensor.detach().cpu()

def materialise():
    """Run every pending graph so live XLA tensors hold device buffers (independent of the candidate)."""
    from xla_probe import sync
    sync()


def run_fresh(candidate, code, timeout=300, env=None):
    """Run `code` in a fresh Python process with `candidate` installed first (`env` added to its
    environment); returns the JSON object the code prints on its last line. The candidate is `accel`
    inside `code`."""
    # gc.freeze(): torch, torch_xla and DeepSpeed, imported for good, stay out of every later collection and
    # out of the exit's (about a second less per process); what `code` makes afterwards is collected as before
    prelude = "import gc\nfrom harness.candidate.candidate_env import install_current\naccel = install_current()\ngc.freeze()\n"
    proc = subprocess.run([sys.executable, "-c", prelude + code],
                          env=candidate_env.child_env(candidate, {**os.environ, **(env or {})}),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise AssertionError(f"fresh process with the candidate failed (exit {proc.returncode}):\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
