"""DeepSpeed's multi-node runner with the candidate, on a bed of 2 hosts on this machine (harness/multihost.py):
what every rank gets, what the launcher parent on host 0 leaves alone, and how a run ends when a host cannot
take part or a rank on another host dies.

The command is a pod user's, unchanged: `DS_ACCELERATOR=xla deepspeed --hostfile H --master_addr host0 SCRIPT`
from host 0, with DeepSpeed's default pdsh runner over ssh. Every run has a deadline, and no process may be left
on any host once the launcher has ended.
"""

import json
import os
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import logs, multihost
from harness.candidate.candidate_env import accelerator_env
from harness.launching import free_port, hostfile_command, launch_on_hosts
from harness.paths import FIXTURES

pytestmark = [pytest.mark.area("multihost"),
              pytest.mark.skipif(multihost.unavailable() is not None, reason=str(multihost.unavailable()))]

SLOTS = 2  # ranks per host
FAILURE_DEADLINE_S = 180  # a failed run ends in well under a minute; a run that waits for a lost peer never does
ENV_FILE_VARIABLE = "MULTIHOST_FROM_ENV_FILE"  # a name no runner forwards by prefix: only .deepspeed_env brings it


def _failure_run(bed, hostfile, args, candidate, workdir, env=None):
    run = launch_on_hosts(bed, hostfile, args, candidate, workdir, env=env, timeout=FAILURE_DEADLINE_S)
    return run, bed.left_behind()


def test_launched_ranks_follow_the_hostfile(accel, candidate, evidence, tmp_path):
    (tmp_path / ".deepspeed_env").write_text(f"{ENV_FILE_VARIABLE}=from-the-env-file\n")
    with multihost.HostBed(2, tmp_path / "bed") as bed:
        hostfile = bed.hostfile(tmp_path / "hostfile", SLOTS)
        out = tmp_path / "ranks"
        run = launch_on_hosts(bed, hostfile, [FIXTURES / "probe_env.py", "--out", out, "--vars",
                                              f"DS_ACCELERATOR,{ENV_FILE_VARIABLE}"], candidate, tmp_path, timeout=300)
        left = bed.left_behind()
    assert run.returncode == 0, f"`deepspeed --hostfile` over 2 hosts exited {run.returncode}:\n{logs.tail(run.log)}"
    world = 2 * SLOTS
    ranks = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)}
    evidence.update(ranks=ranks, left_behind=left)
    backend = accel.communication_backend_name()
    for rank, seen in ranks.items():
        host, local_rank = f"host{rank // SLOTS}", rank % SLOTS
        assert seen["host"] == host, f"rank {rank} ran on {seen['host']}; the hostfile's order puts it on {host}"
        launch_vars = {name: seen["env"][name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        assert launch_vars == {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world)}, (
            f"rank {rank} on {host} was launched with {launch_vars}")
        assert seen["env"]["DS_ACCELERATOR"] == "xla", f"DS_ACCELERATOR did not reach rank {rank} on {host}"
        assert seen["env"][ENV_FILE_VARIABLE] == "from-the-env-file", (
            f"rank {rank} on {host}: {ENV_FILE_VARIABLE} from .deepspeed_env in the working directory did not reach it")
        assert seen["device"].startswith("xla"), f"rank {rank} on {host} computed on {seen['device']}"
        assert seen["backend"] == backend, f"rank {rank} on {host}: backend {seen['backend']}, the accelerator's is {backend}"
        assert seen["all_reduce"] == float(world), (
            f"rank {rank} on {host}: all_reduce of ones over {world} ranks on 2 hosts gave {seen['all_reduce']}")
    assert not left, f"the launcher ended, and processes were left on hosts: {left}"


def test_runner_parent_on_host0_leaves_runtime_uninitialised(candidate, evidence, tmp_path):
    # fixtures/runner_parent.py: the real runner up to starting pdsh (its ssh check is the runs' to prove)
    with multihost.HostBed(2, tmp_path / "bed") as bed:
        hostfile = bed.hostfile(tmp_path / "hostfile", SLOTS)
        cmd = bed.on_host(0, [sys.executable, FIXTURES / "runner_parent.py", "--hostfile", hostfile, "--master_addr",
                              "host0", "--master_port", str(free_port()), "--no_ssh_check", "train.py"], tmp_path)
        proc = subprocess.run(cmd, env=bed.client_env(accelerator_env(candidate)), capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 0, f"the runner parent failed on host 0:\n{proc.stderr[-3000:]}"
    parent = json.loads(proc.stdout.strip().splitlines()[-1])
    evidence.update(runtime_initialized=parent["runtime_initialized"], world_info=parent["world_info"])
    assert parent["runtime_initialized"] is False, (
        "`deepspeed --hostfile` initialised the XLA runtime in the launcher parent on host 0: on a TPU VM the "
        "parent would own host 0's chips")
    assert parent["world_info"] == {"host0": [0, 1], "host1": [0, 1]}, (
        f"the runner would start ranks {parent['world_info']} from a hostfile of host0, host1 with {SLOTS} slots")


TPU_CHIPS = 4  # per host of the bed's TPU v4 slice
TPU_BASE_PORT = 8476  # PyTorch/XLA's first per-process port


def _tpu_launch(bed, order, candidate, workdir):
    hostfile = bed.hostfile(workdir / "hostfile", TPU_CHIPS, order=order)
    out = workdir / "ranks"
    # The hosts have TPU chips and metadata but no TPU runtime: the probe reads its environment and touches no
    # device, and a launcher process that started the runtime would fail the run.
    run = launch_on_hosts(bed, hostfile, [FIXTURES / "probe_tpu_env.py", "--out", out], candidate, workdir,
                          env={"PJRT_DEVICE": "TPU"}, timeout=FAILURE_DEADLINE_S)
    return run, out, bed.left_behind()


def test_tpu_slice_ranks_get_the_topology_pytorch_xla_spawn_would(candidate, evidence, tmp_path):
    # docs/tpu.md: one chip per process, the slice as a grid of one-chip processes, a port per local rank on
    # every host's address in worker-id order, and CLOUD_TPU_TASK_ID = worker id x chips per host + local rank
    with multihost.HostBed(2, tmp_path / "bed", tpu=True) as bed:
        run, out, left = _tpu_launch(bed, [0, 1], candidate, tmp_path)
        addresses = [host.address for host in bed.hosts]
        accelerator_type = bed.accelerator_type
    assert run.returncode == 0, (f"`deepspeed --hostfile` on the 2 workers of a {accelerator_type} slice exited "
                                 f"{run.returncode}:\n{logs.tail(run.log)}")
    world = 2 * TPU_CHIPS
    ranks = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)}
    evidence.update(accelerator_type=accelerator_type, ranks=ranks, left_behind=left)
    every_process = ",".join(f"{address}:{TPU_BASE_PORT + chip}" for address in addresses for chip in range(TPU_CHIPS))
    for rank, seen in ranks.items():
        worker, local_rank = divmod(rank, TPU_CHIPS)
        expected = {
            "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "TPU_VISIBLE_CHIPS": str(local_rank), "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": "2,2,2",  # hosts 1,1,2 x chips 2,2,1
            "CLOUD_TPU_TASK_ID": str(rank), "TPU_PROCESS_PORT": str(TPU_BASE_PORT + local_rank),
            "TPU_PROCESS_ADDRESSES": every_process,
            "PJRT_LOCAL_PROCESS_RANK": str(local_rank), "PJRT_LOCAL_PROCESS_COUNT": str(TPU_CHIPS),
        }
        got = {name: seen["env"].get(name) for name in expected}
        wrong = {name: (got[name], want) for name, want in expected.items() if got[name] != want}
        assert seen["host"] == f"host{worker}" and not wrong, (
            f"rank {rank} (TPU worker {worker}, local rank {local_rank}) ran on {seen['host']} with, as (got, "
            f"expected): {wrong}")
    assert not left, f"processes were left on hosts: {left}"


def test_tpu_hostfile_out_of_worker_order_stops_the_run_in_one_line(candidate, evidence, tmp_path):
    with multihost.HostBed(2, tmp_path / "bed", tpu=True) as bed:
        run, out, left = _tpu_launch(bed, [1, 0], candidate, tmp_path)
    last = logs.last_line(run.log)
    evidence.update(returncode=run.returncode, last_line=last, ranks_started=sorted(p.name for p in out.glob("*")),
                    left_behind=left)
    assert not run.timed_out and run.returncode != 0, (
        f"a hostfile listing worker 1 first was not refused (exit {run.returncode}): its ranks' numbering disagrees "
        "with their CLOUD_TPU_TASK_ID")
    assert "worker-id order" in last and "host1" in last, f"the run's last line does not say so: {last!r}"
    assert not out.exists(), f"ranks started before the refusal: {sorted(p.name for p in out.glob('*'))}"
    assert not left, f"processes were left on hosts: {left}"


def test_unreachable_host_stops_the_run_in_one_line(candidate, evidence, tmp_path):
    with multihost.HostBed(2, tmp_path / "bed") as bed:
        hostfile = tmp_path / "hostfile"  # a third address on the hosts' network where no host answers
        unreachable = str(multihost.SUBNET[len(bed.hosts) + 7])
        hostfile.write_text(f"host0 slots={SLOTS}\nhost1 slots={SLOTS}\n{unreachable} slots={SLOTS}\n")
        run, left = _failure_run(bed, hostfile, [FIXTURES / "probe_env.py", "--out", tmp_path / "ranks"], candidate,
                                 tmp_path)
    evidence.update(returncode=run.returncode, seconds=round(run.seconds, 1), last_line=logs.last_line(run.log),
                    left_behind=left)
    assert not run.timed_out, (f"with host {unreachable} unreachable the run did not end within {FAILURE_DEADLINE_S}s "
                               f"(the other hosts' ranks wait for their peers):\n{logs.tail(run.log)}")
    assert run.returncode != 0, "a run with an unreachable host exited 0"
    assert unreachable in logs.last_line(run.log), (
        f"the run's last line does not name the unreachable host {unreachable}: {logs.last_line(run.log)!r}")
    assert not left, f"processes were left on hosts: {left}"


def test_host_without_torch_xla_stops_the_run_in_one_line(candidate, evidence, tmp_path):
    torch_xla_dirs = [Path(p) / "torch_xla" for p in site.getsitepackages() if (Path(p) / "torch_xla").is_dir()]
    with multihost.HostBed(2, tmp_path / "bed", hide={1: torch_xla_dirs}) as bed:
        hostfile = bed.hostfile(tmp_path / "hostfile", SLOTS)
        run, left = _failure_run(bed, hostfile, [FIXTURES / "probe_env.py", "--out", tmp_path / "ranks"], candidate,
                                 tmp_path)
    last = logs.last_line(run.log)
    evidence.update(returncode=run.returncode, seconds=round(run.seconds, 1), last_line=last, left_behind=left)
    assert not run.timed_out, f"with torch_xla missing on host1 the run did not end within {FAILURE_DEADLINE_S}s"
    assert run.returncode != 0, "a run with torch_xla missing on host1 exited 0"
    assert "host1" in last and "torch_xla" in last, (
        f"the run's last line does not say that host1 lacks torch_xla: {last!r}\n{logs.tail(run.log)}")
    assert not left, f"processes were left on hosts: {left}"


def test_rank_dying_on_host1_ends_the_run(candidate, evidence, tmp_path):
    # rank 3 (host1) exits with status 3 while ranks 0-2 wait for it in an all_reduce
    with multihost.HostBed(2, tmp_path / "bed") as bed:
        hostfile = bed.hostfile(tmp_path / "hostfile", SLOTS)
        run, left = _failure_run(bed, hostfile, [FIXTURES / "faulty.py", "--mode", "die", "--faulty-rank", "3"],
                                 candidate, tmp_path, env={"DS_XLA_COLLECTIVE_TIMEOUT": "60"})
    failed_hosts = [line for line in run.log.splitlines() if "ssh exited with exit code" in line]
    evidence.update(returncode=run.returncode, seconds=round(run.seconds, 1), host_lines=failed_hosts,
                    left_behind=left)
    assert not run.timed_out, f"a rank died on host1 and the run did not end within {FAILURE_DEADLINE_S}s"
    assert run.returncode != 0, "a run whose rank 3 exited 3 exited 0"
    # host1's launch.py reports the first failed rank its poll finds: rank 3's status 3, or 1 from rank 2, whose
    # all_reduce failed on the connection rank 3 closed (DeepSpeed's launch.py walks a set of processes)
    assert any(line.endswith(("host1: ssh exited with exit code 3", "host1: ssh exited with exit code 1"))
               for line in failed_hosts), (
        f"the run does not say that host1 failed: {failed_hosts}\n{logs.tail(run.log)}")
    assert "host1: rank 3: exiting with status 3" in run.log, (
        f"the log does not show rank 3 exiting on host1, the failure the run ended on:\n{logs.tail(run.log)}")
    assert not left, f"processes were left on hosts: {left}"


def test_interrupted_run_leaves_no_process_on_any_host(candidate, evidence, tmp_path):
    # a Ctrl-C to `deepspeed` on host 0 in the middle of training
    with multihost.HostBed(2, tmp_path / "bed") as bed:
        hostfile = bed.hostfile(tmp_path / "hostfile", SLOTS)
        losses = tmp_path / "losses.json"
        cmd = hostfile_command(bed, hostfile, [FIXTURES / "train.py", "--deepspeed_config", FIXTURES / "configs" /
                                               "zero3.json", "--steps", "100000", "--losses-out", losses],
                               free_port(), tmp_path)
        with open(tmp_path / "runner.log", "w") as log:
            runner = subprocess.Popen(cmd, env=bed.client_env(accelerator_env(candidate)), stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while not all(bed.processes().values()) and time.monotonic() < deadline:  # ranks on every host
                time.sleep(1)
            time.sleep(10)
            running = {host: len(listed) for host, listed in bed.processes().items()}
            os.killpg(runner.pid, signal.SIGINT)  # as Ctrl-C reaches the foreground job: the runner, pdsh, ssh
            returncode = runner.wait(timeout=60)
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
        left = bed.left_behind()
    evidence.update(running_before=running, returncode=returncode, left_behind=left)
    assert all(running.values()), f"the run was interrupted before every host ran its ranks: {running}"
    assert not left, f"after a Ctrl-C to the runner on host 0 processes were left on hosts: {left}"
