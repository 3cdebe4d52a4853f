"""Bad input gives a clear error naming the rank and the operation, in bounded time.

fixtures/faulty.py makes rank 1 of 2 misbehave after one good all_reduce; the run must
end (DS_XLA_COLLECTIVE_TIMEOUT=10 bounds every collective) with a non-zero exit, an error
that names rank and operation, and no process left behind.
"""

import os
import subprocess
import sys
import time

import psutil
import pytest

from harness.candidate.candidates import parse_spec
from harness.launching import free_port, launch
from harness.paths import FIXTURES

SCRIPT = FIXTURES / "faulty.py"
TIMEOUT_ENV = {"DS_XLA_COLLECTIVE_TIMEOUT": "10"}


def _of_run(process, port):
    """Whether `process` belongs to the launch on `port`: the launcher names it, its ranks have it as MASTER_PORT."""
    try:
        return f"--master_port {port}" in " ".join(process.cmdline()) or process.environ().get("MASTER_PORT") == str(port)
    except psutil.Error:  # gone meanwhile
        return False


def no_survivors(run, tag):
    # Only this run's processes: another test's launch of the same script may be running beside it.
    left = [p for p in psutil.process_iter(["cmdline"]) if tag in " ".join(p.info["cmdline"] or []) and _of_run(p, run.port)]
    assert not left, f"processes left behind: {[p.pid for p in left]}"


@pytest.mark.slow
@pytest.mark.parametrize("mode,expected", [
    # rank 1 stops taking part: rank 0 times out and says where rank 1 is
    ("hang", ["rank 0 in group [0, 1]: all_reduce(op=SUM) (#2) failed", "Timed out",
              "rank 1 is at #1 all_reduce(op=SUM)"]),
    # rank 1 exits: rank 0's collective fails at once, the launcher reports the exit
    ("die", ["rank 0 in group [0, 1]: all_reduce(op=SUM) (#2) failed", "rank 1 is at #1 all_reduce(op=SUM)"]),
    # the ranks call different collectives at the same point: each is told what the other called
    ("mismatch", ["rank 0 in group [0, 1]: all_reduce(op=SUM) (#2) failed",
                  "rank 1 is at #2 barrier, where this rank called all_reduce(op=SUM)"]),
    # an operation the backend cannot do: refused by name on the rank that asked
    ("unsupported", ["rank 1 in group [0, 1]: recv(src=None) is not supported by the XLA host bridge"]),
])
def test_misbehaving_rank_fails_fast_and_clearly(mode, expected, tmp_path):
    run = launch([SCRIPT, "--mode", mode], parse_spec("deepspeed_xla"), tmp_path, num_gpus=2, env=TIMEOUT_ENV,
                 timeout=240)
    assert not run.timed_out, f"{mode}: the run hung:\n{run.log[-3000:]}"
    assert run.returncode != 0, f"{mode}: the run exited 0:\n{run.log[-3000:]}"
    assert run.seconds < 120, f"{mode}: took {run.seconds:.0f}s"
    for text in expected:
        assert text in run.log, f"{mode}: {text!r} missing from the log:\n{run.log[-4000:]}"
    no_survivors(run, str(SCRIPT))


@pytest.mark.slow
def test_missing_peer_at_startup_ends_in_bounded_time():
    # Rank 0 of 2 started alone: the rendezvous gives up after the process group's timeout (DeepSpeed's
    # DEEPSPEED_TIMEOUT, whole minutes; here init_distributed's own `timeout`, so the wait is seconds).
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DS_ACCELERATOR="xla", PJRT_DEVICE="CPU", **TIMEOUT_ENV)
    code = "import datetime, deepspeed; deepspeed.init_distributed(timeout=datetime.timedelta(seconds=10))"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode != 0
    assert "1/2 clients joined" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - started < 60, f"rank 0 waited {time.monotonic() - started:.0f}s for a 10s timeout"
