"""Starting the processes a check runs: one rank as `python script.py`, or DeepSpeed's launcher.

Every run goes in its own session, which is killed whole when the run ends, and leaves nothing
behind that outlives it: no rank, and no shared-memory segment of DeepSpeed's CPU accelerator.
"""

import dataclasses
import fcntl
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import child_processes
from harness.candidate.candidate_env import accelerator_env

DEEPSPEED_RUNNER = ("-m", "deepspeed.launcher.runner")
SHM_DIR = Path("/dev/shm")
SESSION_LEADER = Path(__file__).with_name("session_leader.py")
SHM_SETTLE_S = 5.0  # a job maps its buffer microseconds after writing it: older and unmapped means abandoned
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_FLOOR = 20000  # rendezvous ports from here up to the kernel's ephemeral range
PORT_TRIES = 200
PORT_LOCKS = Path(tempfile.gettempdir()) / f"deepspeed-xla-ports-{os.getuid()}"
_reserved_ports = {}  # port -> the open file whose lock reserves it


@dataclasses.dataclass
class Launch:
    """How a run ended: exit status (negative: killed by that signal), its whole log, wall seconds,
    and the rendezvous port (MASTER_PORT) it was given, if any."""
    returncode: int
    log: str
    seconds: float
    timed_out: bool = False
    port: int | None = None


def _ephemeral_ports_start(path=EPHEMERAL_RANGE):
    """The lowest port the kernel hands out on its own (bind to port 0, a connection's source port)."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def rendezvous_ports():
    """The ports free_port picks from: PORT_FLOOR up to the kernel's ephemeral range (all of them from
    PORT_FLOOR up, where that range starts lower)."""
    start = _ephemeral_ports_start()
    return range(PORT_FLOOR, start if start > PORT_FLOOR else 65536)


def _bindable(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore binds: TIME_WAIT is no bar
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def free_port():
    """A TCP port for a job's rendezvous (MASTER_PORT) that nothing listens on now, reserved for this
    process until `release_port(port)` (run_in_session releases its port) or until it exits.

    Rank 0 binds the port seconds after it is chosen, once its imports are done. A port that the kernel
    picked (bind to port 0) is free for anyone meanwhile: another job's pick, or any connection's source
    port, may take it, and rank 0 then fails with EADDRINUSE. So ports come from below the kernel's
    ephemeral range, at random, each reserved by an exclusive lock on a file under PORT_LOCKS that every
    harness process of this user respects (released by the kernel if the process dies).
    Raises OSError when none of PORT_TRIES ports is free.
    """
    PORT_LOCKS.mkdir(mode=0o700, exist_ok=True)
    ports = rendezvous_ports()
    picks = random.sample(ports, min(PORT_TRIES, len(ports)))
    for port in picks:
        lock = open(PORT_LOCKS / str(port), "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: by another harness process, or by this one (flock locks per open file)
            lock.close()
            continue
        if _bindable(port):
            _reserved_ports[port] = lock
            return port
        lock.close()
    raise OSError(f"no free TCP port among {len(picks)} tried in {ports[0]}-{ports[-1]} (listened on, or "
                  f"reserved by other harness processes under {PORT_LOCKS}): end what holds them, then run again")


def release_port(port):
    """Give up this process's reservation of `port` (from free_port); nothing when it holds none."""
    lock = _reserved_ports.pop(port, None)
    if lock is not None:
        lock.close()


def single_rank_env(port=None):
    """torch.distributed's environment for one rank started as `python script.py` (as torchrun
    would set it), on `port` or a free local one."""
    return dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port or free_port()))


def _unlink_all(paths):
    removed = 0
    for path in paths:
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def release_shm_buffers(port, shm_dir=SHM_DIR):
    """Remove the shared-memory all-reduce buffers DeepSpeed's CPU accelerator made for a job on
    `port` (`deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`, 69 MB per rank): DeepSpeed's
    shm comm never unlinks them, so every multi-rank CPU run would leave its ranks' buffers in
    memory until reboot. Returns how many were removed."""
    return _unlink_all(Path(shm_dir).glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"))


def _mapped_files(proc_root):
    """Every file some process maps (/proc/<pid>/maps), as far as this user may read them."""
    mapped = set()
    for maps in Path(proc_root).glob("[0-9]*/maps"):
        try:
            fields = (line.split(maxsplit=5) for line in maps.read_text().splitlines())
            mapped.update(field[5] for field in fields if len(field) == 6)  # anonymous mappings name no file
        except OSError:  # the process ended, or is not ours to read
            continue
    return mapped


def release_unused_shm_buffers(since, shm_dir=SHM_DIR, proc_root="/proc", settle_s=SHM_SETTLE_S):
    """Remove this user's DeepSpeed all-reduce buffers written at or after `since` (epoch seconds)
    that no process maps any more: what a session of jobs on ports the harness did not choose
    (DeepSpeed's own test harness, under `upstream`) left behind. A rank maps its buffer right after
    writing it and keeps it mapped until it exits, so a buffer older than `settle_s` that nobody
    maps belongs to no live job; younger ones are left alone. Returns how many were removed."""
    candidates, settled = [], time.time() - settle_s
    for path in Path(shm_dir).glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*"):
        try:
            if since <= path.stat().st_mtime <= settled:
                candidates.append(path)
        except FileNotFoundError:
            continue
    if not candidates:
        return 0
    mapped = _mapped_files(proc_root)
    return _unlink_all(path for path in candidates if str(path) not in mapped)


def run_in_session(cmd, env, workdir, log_path, timeout, port=None):
    """Run `cmd` in its own session and, whatever happens (exit, failure, timeout), kill the
    whole session before returning, so no rank a launcher started outlives the run; then release
    the shared-memory buffers of the job on `port`. The session's leader (session_leader.py) kills
    it as well if this process dies first, a SIGKILL included. `port` (from free_port) is released last."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = None
        timed_out = False
        try:
            with child_processes.interrupts_held():  # a Ctrl-C while it starts would orphan the launcher
                proc = subprocess.Popen([sys.executable, "-I", "-S", str(SESSION_LEADER), str(os.getpid()), *cmd],
                                        cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, preexec_fn=child_processes.terminated_with_parent)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
            if port is not None:
                release_shm_buffers(port)
                release_port(port)
    return Launch(proc.returncode, Path(log_path).read_text(), time.monotonic() - start, timed_out, port)


def deepspeed_command(resources, script_args, port, runner=DEEPSPEED_RUNNER):
    """`deepspeed RESOURCES --master_port PORT SCRIPT_ARGS` (`python -m` the runner, so the
    command does not depend on PATH)."""
    return [sys.executable, *runner, *resources, "--master_port", str(port), *map(str, script_args)]


def launch(script_args, candidate, workdir, *, num_gpus=None, include=None, env=None, timeout=600,
           runner=DEEPSPEED_RUNNER):
    """`deepspeed [--num_gpus N | --include ...] --master_port P script_args` on `candidate`
    (None: DeepSpeed's CPU accelerator) on a free port; `env` adds to the environment."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    resources = ["--num_gpus", str(num_gpus)] if num_gpus is not None else []
    if include is not None:
        resources = ["--include", include]
    label = "cpu" if candidate is None else candidate.name
    port = free_port()
    return run_in_session(deepspeed_command(resources, script_args, port, runner), accelerator_env(candidate, env),
                          workdir, workdir / f"launch-{label}-{time.monotonic_ns()}.log", timeout, port=port)


def hostfile_command(bed, hostfile, script_args, port, workdir):
    """`deepspeed --hostfile HOSTFILE --master_addr host0 --master_port PORT SCRIPT_ARGS` as run on host 0 of `bed`
    (harness/multihost.py) in `workdir`; with `bed.client_env(...)` as its environment."""
    resources = ["--hostfile", str(hostfile), "--master_addr", bed.hosts[0].name]
    return bed.on_host(0, deepspeed_command(resources, script_args, port), workdir)


def launch_on_hosts(bed, hostfile, script_args, candidate, workdir, *, env=None, timeout=600):
    """`deepspeed --hostfile ...` (hostfile_command) on `candidate` from host 0 of `bed`, as `launch` runs a single
    host: in a session of its own, killed whole when the run ends; processes it left on the hosts are the bed's
    to find (`bed.settled_processes()`)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    label = "cpu" if candidate is None else candidate.name
    port = free_port()
    return run_in_session(hostfile_command(bed, hostfile, script_args, port, workdir),
                          bed.client_env(accelerator_env(candidate, env)), workdir,
                          workdir / f"launch-hosts-{label}-{time.monotonic_ns()}.log", timeout, port=port)

