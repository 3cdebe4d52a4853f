"""The launcher side of multi-rank XLA runs: deepspeed_xla/patches/launch.py and the `deepspeed` command.

Unit tests: the env file DeepSpeed reads only on its multi-node path, the emulated device
count for --include, the per-worker TPU topology applied from a fake TPU host (no TPU
needed), and the runner parent applying both. End to end (PJRT CPU):
`deepspeed --include localhost:0,1` with an env file gives each rank its own device and
launch variables.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed_xla.backend import pjrt_env
from deepspeed_xla.patches import launch
from harness.candidate.candidates import parse_spec
from harness.launching import launch as run_launcher
from harness.paths import FIXTURES
from xla_host import tpu_topology

GOOGLE = "0x1ae0"


# -- env files --------------------------------------------------------------------------
def test_env_file_values_keep_equals_signs_and_skip_comments(tmp_path):
    path = tmp_path / ".deepspeed_env"
    path.write_text("A=1\n# a comment\n\nB=x=y\nC=\n")
    assert launch.parse_env_file(path) == {"A": "1", "B": "x=y", "C": ""}


def test_env_file_rejects_a_line_without_equals(tmp_path):
    path = tmp_path / ".deepspeed_env"
    path.write_text("A=1\nnot a setting\n")
    with pytest.raises(ValueError, match=r"\.deepspeed_env:2: expected KEY=VALUE"):
        launch.parse_env_file(path)


def test_env_files_home_then_working_dir_and_ds_env_file(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    (home / "run.env").write_text("FROM_HOME=h\nBOTH=home\n")
    (cwd / "run.env").write_text("BOTH=cwd\n")
    (cwd / ".deepspeed_env").write_text("IGNORED=1\n")
    environ = {"DS_ENV_FILE": "run.env", "BOTH": "inherited"}
    applied = launch.apply_env_files(environ, cwd=str(cwd), home=str(home))
    assert applied == {"FROM_HOME": "h", "BOTH": "cwd"}
    assert environ["BOTH"] == "cwd" and "IGNORED" not in environ


def test_no_env_file_changes_nothing(tmp_path):
    environ = {"X": "1"}
    assert launch.apply_env_files(environ, cwd=str(tmp_path), home=str(tmp_path)) == {}
    assert environ == {"X": "1"}


# -- --include on emulated devices -------------------------------------------------------
@pytest.mark.parametrize("include,exclude,needed", [
    ("", "", 0),
    ("localhost:0,1", "", 2),
    ("localhost:3", "", 4),
    ("localhost", "", 0),
    ("worker-0:0,1@worker-1:0,2", "", 3),
    ("", "localhost:1", 2),
])
def test_slots_needed(include, exclude, needed):
    assert launch.slots_needed(include, exclude) == needed


def test_slots_needed_rejects_non_numbers():
    with pytest.raises(ValueError, match="not a device slot"):
        launch.slots_needed("localhost:a")


# -- per-worker TPU topology --------------------------------------------------------------
V4_8 = tpu_topology.TpuTopology(accelerator_type="v4-8", host_bounds=(1, 1, 1), chips_per_host_bounds=(2, 2, 1),
                                worker_id=0, worker_ips=("10.0.0.2", ))


def launcher_worker_env(local_rank, local_size="4"):
    # What deepspeed.launcher.launch gives every local rank of a 4-chip host.
    return {"LOCAL_RANK": str(local_rank), "LOCAL_SIZE": local_size, "RANK": str(local_rank), "WORLD_SIZE": "4",
            "TPU_VISIBLE_CHIPS": "0,1,2,3"}


@pytest.mark.parametrize("local_rank", range(4))
def test_tpu_worker_gets_spawn_topology(local_rank):
    environ = launcher_worker_env(local_rank)
    applied = pjrt_env.apply_tpu_worker_env(environ, topology=V4_8)
    expected = pjrt_env.worker_env(V4_8, local_rank, 4)
    assert applied == expected
    assert environ["TPU_VISIBLE_CHIPS"] == str(local_rank), "the launcher's 0,1,2,3 must be overridden"
    assert environ["PJRT_LOCAL_PROCESS_RANK"] == str(local_rank)
    assert environ["TPU_PROCESS_PORT"] == str(8476 + local_rank)
    assert all(environ[key] == value for key, value in expected.items())


def test_tpu_worker_env_detected_from_fake_host(tmp_path):
    # A fake PCI bus with 4 v4 chips and GKE-style topology variables: the real detection path.
    bus = tmp_path / "bus"
    bus.mkdir()
    for slot in range(4):
        device = tmp_path / "devices" / f"0000:00:{slot + 4:02x}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(GOOGLE + "\n")
        (device / "device").write_text("0x005e\n")
        (bus / device.name).symlink_to(device)
    environ = dict(launcher_worker_env(2), TPU_SKIP_MDS_QUERY="1", TPU_ACCELERATOR_TYPE="v4-8",
                   TPU_HOST_BOUNDS="1,1,1", TPU_CHIPS_PER_HOST_BOUNDS="2,2,1", TPU_WORKER_ID="0")
    applied = pjrt_env.apply_tpu_worker_env(environ, sysfs_root=str(bus))
    assert applied["TPU_VISIBLE_CHIPS"] == "2" and environ["TPU_VISIBLE_CHIPS"] == "2"
    assert environ["CLOUD_TPU_TASK_ID"] == "2"
    # A child of this worker inherits the env and must not redo it.
    assert pjrt_env.apply_tpu_worker_env(environ, sysfs_root=str(bus)) is None


@pytest.mark.parametrize("environ", [
    {"TPU_VISIBLE_CHIPS": "0,1,2,3"},  # not a launcher worker
    dict(launcher_worker_env(1), PJRT_DEVICE="CPU"),  # emulation
])
def test_tpu_worker_env_leaves_other_processes_alone(environ):
    before = dict(environ)
    assert pjrt_env.apply_tpu_worker_env(environ, topology=V4_8) is None
    assert environ == before


def test_tpu_worker_env_without_chips_is_a_no_op(tmp_path):
    environ = launcher_worker_env(0)
    assert pjrt_env.apply_tpu_worker_env(environ, sysfs_root=str(tmp_path)) is None


def test_tpu_worker_env_names_a_bad_process_count():
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=0 of 2 local processes.*--num_gpus 4"):
        pjrt_env.apply_tpu_worker_env(launcher_worker_env(0, local_size="2"), topology=V4_8)


# -- the runner parent --------------------------------------------------------------------
@pytest.mark.parametrize("resources,world", [(["--num_gpus", "2"], [0, 1]), (["--include", "localhost:0,1"], [0, 1]),
                                             (["--include", "localhost:1,3"], [1, 3])])
def test_runner_parent_applies_env_file_and_sizes_include(resources, world, tmp_path):
    # (That the parent leaves the XLA runtime alone is the launcher conformance area's check.)
    (tmp_path / ".deepspeed_env").write_text("FROM_ENV_FILE=yes\n")
    env = dict(os.environ, DS_ACCELERATOR="xla", PJRT_DEVICE="CPU", HOME=str(tmp_path / "nohome"))
    env.pop("DS_XLA_CPU_DEVICES", None)
    proc = subprocess.run([sys.executable, FIXTURES / "runner_parent.py", *resources, "script.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parent["accelerator"] == "xla"
    assert parent["worker_env"].get("FROM_ENV_FILE") == "yes", ".deepspeed_env was not applied on a single node"
    assert parent["world_info"] == {"localhost": world}


@pytest.mark.parametrize("argv, parent", [
    (["python", "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "train.py"], True),
    (["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"], True),
    (["python", "-mdeepspeed.launcher.launch", "train.py"], True),
    (["python", "-X", "importtime", "-m", "deepspeed.launcher.runner"], True),
    (["python", "/venv/bin/deepspeed", "--include", "localhost:0,1", "train.py"], True),
    (["python", "-E", "/usr/local/bin/ds", "train.py"], True),
    (["python", "-u", "train.py", "--local_rank=0"], False),  # a worker
    (["python", "train.py", "-m", "deepspeed.launcher.runner"], False),  # the script's own arguments
    (["python", "-X", "deepspeed", "train.py"], False),
    (["python", "-m", "pytest", "tests"], False),
    (["python", "-c", "import deepspeed"], False),
    (["python"], False)])
def test_launcher_parents_are_known_by_their_command_line(argv, parent):
    assert launch.is_launcher_parent(argv) is parent


LAUNCHER_COMMANDS = {
    "runner": [sys.executable, "-m", "deepspeed.launcher.runner", "--help"],
    "launch.py": [sys.executable, "-u", "-m", "deepspeed.launcher.launch", "--help"],
    "deepspeed script": [sys.executable, str(Path(sys.executable).parent / "deepspeed"), "--help"],
    "worker": [sys.executable, "-c", "import deepspeed; print(deepspeed.accelerator.get_accelerator().device_name())"],
}


@pytest.mark.parametrize("process", LAUNCHER_COMMANDS)
def test_launcher_parents_load_the_accelerator_without_torch_xla(process, tmp_path):
    # DeepSpeed's runner and launch.py import deepspeed (and so install the accelerator) only to resolve
    # resources and start workers: importing torch_xla there cost about 3 s each before any worker started.
    env = dict(os.environ, DS_ACCELERATOR="xla", PJRT_DEVICE="CPU", PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.run(LAUNCHER_COMMANDS[process], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "deepspeed_xla._xla_accelerator" in imported, f"{process}: the XLA accelerator was never loaded"
    assert ("torch_xla" in imported) is (process == "worker"), (
        f"{process}: torch_xla {'imported' if 'torch_xla' in imported else 'not imported'}")


@pytest.mark.slow
def test_include_and_env_file_end_to_end(tmp_path):
    # The `deepspeed` console script, --include, DS_ENV_FILE from home and working dir.
    home = tmp_path / "home"
    home.mkdir()
    (home / "xla.env").write_text("DS_XLA_FROM_HOME=home\nDS_XLA_SHARED=home\n")
    (tmp_path / "xla.env").write_text("DS_XLA_SHARED=cwd=yes\n")
    out = tmp_path / "out"
    console = Path(sys.executable).parent / "deepspeed"
    run = run_launcher([FIXTURES / "probe_env.py", "--out", out, "--vars", "DS_XLA_FROM_HOME,DS_XLA_SHARED"],
                       parse_spec("deepspeed_xla"), tmp_path, include="localhost:0,1",
                       env={"HOME": str(home), "DS_ENV_FILE": "xla.env"}, runner=(str(console), ), timeout=300)
    assert run.returncode == 0, run.log[-3000:]
    for rank in range(2):
        report = json.loads((out / f"rank{rank}.json").read_text())
        env = report["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_SIZE"]) == (str(rank), str(rank), "2",
                                                                                          "2")
        assert report["device"] == "xla:0" and report["backend"] == "xla_ds"
        assert report["all_reduce"] == 2.0
        assert env["DS_XLA_FROM_HOME"] == "home" and env["DS_XLA_SHARED"] == "cwd=yes"
    # PJRT CPU's local ranks run on shares of the launcher's cores (backend/core_binding.py).
    cores = [set(json.loads((out / f"rank{rank}.json").read_text())["cores"]) for rank in range(2)]
    assert cores[0] | cores[1] == os.sched_getaffinity(0), f"the ranks' cores {cores} do not cover the launcher's"
    assert len(os.sched_getaffinity(0)) < 2 or not cores[0] & cores[1], f"the two ranks share cores: {cores}"
