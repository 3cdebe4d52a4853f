"""The harness's process launching leaves nothing behind: no rank, no shared-memory buffer."""

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from helpers import alive, gone_within

from harness import child_processes, launching
from harness.launching import SHM_DIR, launch, release_shm_buffers, release_unused_shm_buffers, run_in_session
from harness.paths import FIXTURES, REPO
from harness.training.training import TrainingFailed, run_training


def _buffer(shm_dir, uid, port, rank, addr="127.0.0.1"):
    path = shm_dir / f"deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"
    path.write_bytes(b"x")
    return path


def test_release_shm_buffers_removes_only_the_jobs_own(tmp_path):
    uid = os.getuid()
    own = [_buffer(tmp_path, uid, 29611, rank) for rank in range(2)]
    others = [_buffer(tmp_path, uid, 29612, 0), _buffer(tmp_path, uid, 296110, 0), _buffer(tmp_path, uid + 1, 29611, 0)]
    assert release_shm_buffers(29611, tmp_path) == 2
    assert not any(path.exists() for path in own)
    assert all(path.exists() for path in others)


def test_release_unused_shm_buffers_keeps_older_and_mapped_ones(tmp_path):
    """After a session on ports the harness did not choose: only this user's buffers written since
    the session started, settled, and mapped by no process, go."""
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    uid = os.getuid()
    older = _buffer(shm, uid, 29611, 0)
    os.utime(older, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 60
    left, in_use, other_user = _buffer(shm, uid, 40001, 0), _buffer(shm, uid, 40002, 1), _buffer(shm, uid + 1, 40003, 0)
    for path in (left, in_use, other_user):
        os.utime(path, (time.time() - 30, time.time() - 30))
    just_made = _buffer(shm, uid, 40004, 0)  # written a moment ago: its rank may not have mapped it yet
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "maps").write_text(f"7f00-7f10 rw-s 00000000 00:1a 99   {in_use}\n7f20-7f30 rw-p 00000000 00:00 0 \n")
    assert release_unused_shm_buffers(since, shm, proc) == 1
    assert not left.exists() and older.exists() and in_use.exists() and other_user.exists() and just_made.exists()


HOLD_PORT = """
import sys
from pathlib import Path
from harness import launching
launching.rendezvous_ports, launching.PORT_LOCKS = lambda: [{port}], Path({locks!r})
print(launching.free_port(), flush=True)
sys.stdin.read()
"""


def test_free_port_gives_each_port_to_one_process_at_a_time(tmp_path, monkeypatch):
    """A job's rendezvous port stays its own from the pick until the job ends: never one something listens
    on, never one another harness process holds, the same port again once its holder released it or died."""
    listener = socket.create_server(("", 0))
    busy = listener.getsockname()[1]
    with socket.socket() as probe:
        probe.bind(("", 0))
        free = probe.getsockname()[1]
    locks = tmp_path / "locks"
    monkeypatch.setattr(launching, "rendezvous_ports", lambda: [busy, free])
    monkeypatch.setattr(launching, "PORT_LOCKS", locks)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_PORT.format(port=free, locks=str(locks))], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with listener:
        try:
            assert holder.stdout.readline().strip() == str(free)
            with pytest.raises(OSError, match=f"no free TCP port among 2 tried in {busy}-{free}"):
                launching.free_port()
        finally:
            holder.stdin.close()
            holder.wait(timeout=60)
        assert launching.free_port() == free  # the holder's exit ended its reservation
        try:
            with pytest.raises(OSError):
                launching.free_port()  # this process's own reservation counts too
        finally:
            launching.release_port(free)
        assert launching.free_port() == free
        launching.release_port(free)


def test_a_cpu_accelerator_job_leaves_no_shm_buffer(tmp_path):
    """DeepSpeed's CPU accelerator (the reference) makes a 69 MB shared-memory buffer per rank in
    init_distributed and never unlinks it."""
    run = launch([FIXTURES / "probe_env.py", "--out", tmp_path / "ranks"], None, tmp_path, num_gpus=2, timeout=300)
    assert run.returncode == 0, run.log[-3000:]
    left = sorted(path.name for path in SHM_DIR.glob(f"deepspeed_allreduce_buffer_*_{run.port}_*"))
    assert not left, f"the job on port {run.port} left {left} in {SHM_DIR}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_a_child_starts_arrives_once_the_caller_holds_it(sig):
    """A Ctrl-C (or the harness's SIGTERM) between a launcher's fork and its caller holding the Popen
    would leave the launcher and its ranks running: inside interrupts_held() the signal waits for the
    block's end, where the caller's cleanup can stop what it started."""
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # Python's own handlers, as a run has them (also where this process was started with SIGINT ignored)
    previous = signal.signal(sig, stop if sig == signal.SIGTERM else signal.default_int_handler)
    reached = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with child_processes.interrupts_held():
                os.kill(os.getpid(), sig)
                time.sleep(0.2)  # Python runs signal handlers between bytecodes: long since due here
                reached.append("the rest of the block")
        assert reached == ["the rest of the block"]
        assert signal.getsignal(sig) in (stop, signal.default_int_handler)
    finally:
        signal.signal(sig, previous)


def test_an_interrupt_held_while_a_child_fails_to_start_still_arrives():
    """Popen may raise (no such program, no memory): an interrupt held meanwhile is not dropped."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            with child_processes.interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                raise FileNotFoundError("no such program")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(raised.value.__context__, FileNotFoundError)


# A launcher as DeepSpeed's single-node runner is one: it starts a rank, passes no signal on, and waits.
LAUNCHER = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(rank.pid))
rank.wait()
"""

# A check process: it runs the launcher through run_in_session, as the harness's checks do.
CHECK = """
import os, sys
from pathlib import Path
from harness.launching import run_in_session
workdir = Path(sys.argv[1])
run_in_session([sys.executable, "-c", sys.argv[2], str(workdir / "rank.pid")], dict(os.environ), workdir,
               workdir / "launch.log", timeout=600)
"""



def test_a_killed_check_process_leaves_no_rank_running(tmp_path):
    """The OOM killer picking a check process (a pytest worker) runs none of its cleanup: its launch's
    session must end with it, not run its ranks on unwatched."""
    check = subprocess.Popen([sys.executable, "-c", CHECK, str(tmp_path), LAUNCHER], cwd=REPO)
    pid_file, deadline = tmp_path / "rank.pid", time.monotonic() + 60
    while time.monotonic() < deadline and not (pid_file.is_file() and pid_file.read_text()):
        time.sleep(0.1)
    rank = int(pid_file.read_text())
    assert alive(psutil.Process(rank))
    check.kill()
    check.wait()
    if not gone_within(rank, 10):
        os.kill(rank, signal.SIGKILL)
        pytest.fail("the rank outlived its killed check process by 10 s")


@pytest.mark.parametrize("code, returncode", [("sys.exit(3)", 3), ("os.kill(os.getpid(), signal.SIGABRT)", -6),
                                              ("os.kill(os.getpid(), signal.SIGKILL)", -9)])
def test_a_launch_ends_as_its_command_did(tmp_path, code, returncode):
    """The session's leader stands between run_in_session and the command: the exit status, or the
    signal that killed the command, and its output still come through as the command's own."""
    command = [sys.executable, "-c", f"import os, signal, sys; print('said', flush=True); {code}"]
    run = run_in_session(command, dict(os.environ), tmp_path, tmp_path / "launch.log", timeout=60)
    assert (run.returncode, run.log) == (returncode, "said\n")


HANGS_AT_EXIT = """
import json, sys, time
out = sys.argv[sys.argv.index("--losses-out") + 1]
json.dump({"losses": [1.0], "device": "cpu"}, open(out, "w"))
time.sleep(600)
"""


@pytest.mark.parametrize("writes_losses", [True, False], ids=["finished", "in-training"])
def test_a_run_past_its_deadline_says_whether_it_had_finished(tmp_path, writes_losses):
    script = tmp_path / "train.py"
    script.write_text(HANGS_AT_EXIT if writes_losses else "import time\ntime.sleep(600)\n")
    with pytest.raises(TrainingFailed) as failed:
        run_training(script, tmp_path / "config.json", None, tmp_path, timeout=8)
    finished = "trained to the end (its losses written) but did not exit within 8s: a process of it hung at exit"
    assert (finished in str(failed.value)) == writes_losses
    assert ("timed out after 8s" in str(failed.value)) != writes_losses
