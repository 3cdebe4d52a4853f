"""Start a benchmark's worker as the ranks of one world (PJRT CPU, deepspeed_xla installed), the
way DeepSpeed's launcher sets them up: RANK, LOCAL_RANK, WORLD_SIZE and a rendezvous address."""

import subprocess
import sys

RESULT_PREFIX = "bench-result "  # rank 0's result lines, among whatever DeepSpeed logs to stdout


def launch(script, args, world):
    """Popen objects for ranks 0..world-1 of `script --worker ARGS`; rank 0's stdout is a text pipe."""
    from harness import candidates
    from harness.training import accelerator_env, free_port
    port = free_port()
    procs = []
    for rank in range(world):
        env = accelerator_env(candidates.parse_spec(candidates.DEFAULT_SPEC), {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([sys.executable, str(script), "--worker", *args], env=env, text=True,
                                      stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
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
            lines.append(f"rank {rank} failed: {(proc.stderr.read().strip().splitlines() or ['(no output)'])[-1][:160]}")
    return lines
