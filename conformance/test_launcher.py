"""DeepSpeed's own launcher (`deepspeed`, deepspeed/launcher/runner.py) with the candidate.

The runner parent resolves the accelerator, counts devices (`device_count()`) and builds
every worker's environment, all in one process that must leave the XLA runtime alone: on a
TPU VM the process that initialises it owns the chips, and no worker would get one.
fixtures/runner_parent.py runs the real runner up to starting the workers. Then the workers
themselves: each rank DeepSpeed starts gets its launch variables, one XLA device, and a
process group of the candidate's backend that reaches every other rank.
"""

import json
import subprocess
import sys

import pytest

from harness.candidate.candidate_env import accelerator_env
from harness.launching import launch
from harness.paths import FIXTURES

pytestmark = pytest.mark.area("launcher")

RANKS = (2, 4)


def _runner_parent(candidate, args, workdir):
    proc = subprocess.run([sys.executable, FIXTURES / "runner_parent.py", *args], cwd=workdir,
                          env=accelerator_env(candidate), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"deepspeed {' '.join(args)} failed in the runner parent:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ranks", RANKS, ids=[f"num_gpus-{n}" for n in RANKS])
def test_device_count__runner_parent_leaves_runtime_uninitialised(ranks, candidate, evidence, tmp_path):
    parent = _runner_parent(candidate, ["--num_gpus", str(ranks), "train.py"], tmp_path)
    evidence.update(runtime_initialized=parent["runtime_initialized"], world_info=parent["world_info"])
    assert parent["runtime_initialized"] is False, (
        f"`deepspeed --num_gpus {ranks}` initialised the XLA runtime in the launcher parent (device_count() or "
        "another accelerator call on the runner's path): on a TPU VM the parent would own the chips")
    assert parent["world_info"] == {"localhost": list(range(ranks))}, (
        f"the runner would start ranks {parent['world_info']} for --num_gpus {ranks}")


def test_communication_backend_name__launched_ranks(accel, candidate, evidence, tmp_path):
    out = tmp_path / "ranks"
    run = launch([FIXTURES / "probe_env.py", "--out", out], candidate, tmp_path, num_gpus=2, timeout=300)
    assert run.returncode == 0, f"`deepspeed --num_gpus 2 probe_env.py` exited {run.returncode}:\n{run.log[-3000:]}"
    ranks = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)}
    evidence.update(ranks=ranks)
    backend = accel.communication_backend_name()
    for rank, seen in ranks.items():
        launch_vars = {name: seen["env"][name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        assert launch_vars == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}, (
            f"rank {rank} was launched with {launch_vars}")
        assert seen["device"].startswith("xla"), f"rank {rank} computed on {seen['device']}, not an XLA device"
        assert seen["backend"] == backend, (
            f"rank {rank}: deepspeed.init_distributed() chose {seen['backend']}; the accelerator names {backend}")
        assert seen["all_reduce"] == 2.0, f"rank {rank}: all_reduce of ones over 2 ranks gave {seen['all_reduce']}"
