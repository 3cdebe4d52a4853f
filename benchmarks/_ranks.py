"""Start a benchmark's worker as the ranks of one world (PJRT CPU, deepspeed_xla installed), the
way DeepSpeed's launcher sets them up: RANK, LOCAL_RANK, WORLD_SIZE and a rendezvous address."""

import subprocess
import sys
import tempfile
import threading

from harness.child_processes import dies_with_parent

RESULT_PREFIX = "bench-result "  # rank 0's result lines, among whatever DeepSpeed logs to stdout
TIMEOUT_S = 1800  # a world still running after this is stopped (a rank that died leaves the others waiting)


def launch(script, args, world, on_cpu_accelerator=False):
    """Popen objects for ranks 0..world-1 of `script --worker ARGS` on deepspeed_xla (or, with
    on_cpu_accelerator, DeepSpeed's CPU accelerator); rank 0's stdout is a text pipe, each rank's
    stderr a temporary file. All are killed after TIMEOUT_S, and when this process ends."""
    from harness.candidate import candidates
    from harness.candidate.candidate_env import accelerator_env
    from harness.launching import free_port
    port = free_port()
    procs = []
    for rank in range(world):
        env = accelerator_env(None if on_cpu_accelerator else candidates.parse_spec(candidates.DEFAULT_SPEC), {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen([sys.executable, str(script), "--worker", *args], env=env, text=True,
                                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=log,
                                preexec_fn=dies_with_parent)
        proc.stderr_log = log  # Popen keeps no handle on a file it was given, only on its own pipes
        procs.append(proc)
    watchdog = threading.Timer(TIMEOUT_S, lambda: [proc.kill() for proc in procs])
    watchdog.daemon = True
    watchdog.start()
    return procs


def results(procs):
    """The result lines rank 0 printed (prefix removed), as they come."""
    for line in procs[0].stdout:
        if line.startswith(RESULT_PREFIX):
            yield line[len(RESULT_PREFIX):]


def failures(procs):
    """After the run: one line per rank that exited non-zero, its last stderr line."""
    lines = []
    for rank, proc in enumerate(procs):
        if proc.wait() != 0:
            proc.stderr_log.seek(0)
            last = (proc.stderr_log.read().strip().splitlines() or ["(no output)"])[-1]
            lines.append(f"rank {rank} failed (exit {proc.returncode}): {last}")
    return lines
