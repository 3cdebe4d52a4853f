"""Every collective of the `xla_ds` backend (host-bridge transport), at 2 and 4 ranks.

fixtures/collectives.py runs under `DS_ACCELERATOR=xla deepspeed --num_gpus N` and
checks each case against its closed-form result (rank-dependent inputs, nccl-tests
style): in-place results, AVG, views, outputs aliasing inputs, async handles,
coalescing, subgroups, point to point, a real barrier. One launch per world size;
one test per case and world size.
"""

import ast
import json
import sys

import pytest

from harness.training import FIXTURES

sys.path.insert(0, str(FIXTURES))
from harness.training import launch

SCRIPT = FIXTURES / "collectives.py"


def case_names():
    tree = ast.parse(SCRIPT.read_text())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(getattr(d, "id", None) == "case" for d in node.decorator_list)]


_runs = {}


def results(world_size, tmp_path_factory):
    if world_size not in _runs:
        workdir = tmp_path_factory.mktemp(f"collectives{world_size}")
        out = workdir / "results"
        run = launch([SCRIPT, "--out", out], "xla", workdir, num_gpus=world_size, timeout=300)
        per_rank = {}
        for rank in range(world_size):
            path = out / f"rank{rank}.json"
            per_rank[rank] = json.loads(path.read_text()) if path.exists() else None
        _runs[world_size] = (run, per_rank)
    return _runs[world_size]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("case", case_names())
def test_collective(case, world_size, tmp_path_factory):
    run, per_rank = results(world_size, tmp_path_factory)
    missing = [rank for rank, result in per_rank.items() if result is None]
    assert not missing, f"ranks {missing} wrote no results (exit {run.returncode}):\n{run.log[-3000:]}"
    failures = {rank: result[case]["detail"] for rank, result in per_rank.items() if not result[case]["ok"]}
    assert not failures, "\n".join(f"rank {rank}: {detail}" for rank, detail in failures.items())


def test_every_case_is_collected():
    assert len(case_names()) >= 25
