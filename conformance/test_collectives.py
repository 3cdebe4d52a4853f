"""Every collective DeepSpeed calls, through the candidate's communication backend, at 2 and 4
ranks.

fixtures/collectives.py runs on the candidate under DeepSpeed's launcher
(`deepspeed --num_gpus N`) and checks each case against its closed-form result
(rank-dependent inputs, nccl-tests style): a sweep of each collective over dtypes and sizes,
in-place results, AVG, views, outputs aliasing inputs (ZeRO-3's flat buffers), async handles,
coalescing, subgroups, point to point and a real barrier; and misused calls (sizes, list
lengths, split sizes that do not fit), which must be refused at once on every rank, naming
the operation, leaving the group usable. One launch per world size; one check per case and
world size, named after the case.
"""

import json

import pytest
from conformance_helpers import import_fixture_script

from harness.launching import launch
from harness.paths import FIXTURES

pytestmark = pytest.mark.area("collectives")

SCRIPT = "collectives.py"


_runs = {}


def results(world_size, candidate, tmp_path_factory):
    if world_size not in _runs:
        workdir = tmp_path_factory.mktemp(f"collectives{world_size}")
        out = workdir / "results"
        run = launch([FIXTURES / SCRIPT, "--out", out], candidate, workdir, num_gpus=world_size, timeout=300)
        per_rank = {}
        for rank in range(world_size):
            path = out / f"rank{rank}.json"
            per_rank[rank] = json.loads(path.read_text()) if path.exists() else None
        _runs[world_size] = (run, per_rank)
    return _runs[world_size]


@pytest.mark.parametrize("world_size", [2, 4], ids=["2ranks", "4ranks"])
@pytest.mark.parametrize("case", list(import_fixture_script(SCRIPT).CASES))
def test_collective(case, world_size, candidate, evidence, tmp_path_factory):
    run, per_rank = results(world_size, candidate, tmp_path_factory)
    missing = [rank for rank, result in per_rank.items() if result is None]
    assert not missing, (f"ranks {missing} of {world_size} wrote no results (launcher exit {run.returncode}); "
                         f"log tail:\n{run.log[-3000:]}")
    unfinished = [rank for rank, result in per_rank.items() if case not in result]
    assert not unfinished, (f"ranks {unfinished} of {world_size} have no result for {case}: they died or hung in it "
                            f"or before it (launcher exit {run.returncode}); log tail:\n{run.log[-3000:]}")
    failures = {rank: result[case]["detail"] for rank, result in per_rank.items() if not result[case]["ok"]}
    evidence.update(world_size=world_size, failed_ranks=sorted(failures))
    assert not failures, "\n".join(f"{case} on rank {rank} of {world_size}: {detail}"
                                    for rank, detail in failures.items())
