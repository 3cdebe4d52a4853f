"""Train a fixture script under an accelerator and read its per-step losses.

It starts the script the way a user would (`python script.py` with torch.distributed's
environment for one rank, or DeepSpeed's own `deepspeed --num_gpus N` launcher) and reads the
losses the script writes (`--losses-out FILE`: {"losses": [...], "device": "..."}). The cases are
in training_cases.py, the comparison with a reference in loss_comparison.py.
"""

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

from harness import logs, multihost
from harness.candidate.candidate_env import accelerator_env
from harness.launching import deepspeed_command, free_port, hostfile_command, run_in_session, single_rank_env


class TrainingFailed(RuntimeError):
    """The script exited non-zero or wrote no losses; the message carries its log tail."""


@dataclasses.dataclass
class TrainingRun:
    """The per-step losses a script wrote, the device it reported, its whole log; where the script
    reports them (on XLA), its cumulative XLA compilations after each step; and what else it reported."""
    losses: list
    device: str
    log: str
    compilations: list | None = None
    reported: dict = dataclasses.field(default_factory=dict)
    # on several hosts: the processes each host still had after the run's launcher ended ({host: [command line]}),
    # which the run then killed
    left_behind: dict = dataclasses.field(default_factory=dict)


def run_training(script, config, candidate, workdir, *, world_size=1, steps=6, launcher="python", hosts=1,
                 extra_args=(), extra_env=None, timeout=600):
    """Train `script` with DeepSpeed config `config` on `candidate` (a CandidateSpec), or on
    DeepSpeed's CPU accelerator (the reference) when candidate is None; a TrainingRun.

    launcher="python": one rank, started as `python script.py` with RANK/WORLD_SIZE/...
    set (how torchrun-style jobs start a rank). launcher="deepspeed": DeepSpeed's own
    launcher with `--num_gpus world_size`, or with hosts > 1 `--hostfile` over that many hosts of a bed
    started for the run (harness/multihost.py), world_size / hosts ranks each, started from host 0.
    TrainingFailed names the script, config, ranks, accelerator, how the run ended and its last error line,
    with the log tail.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    label = f"{'cpu' if candidate is None else 'candidate'}-{time.monotonic_ns()}"
    losses_file = workdir / f"losses-{label}.json"
    losses_file.unlink(missing_ok=True)
    env = accelerator_env(candidate, extra_env)
    if candidate is None:
        # transformers and Accelerate move every batch to torch_xla's device whenever it imports, whatever
        # DS_ACCELERATOR says: the CPU reference runs as if it were not installed
        env["USE_TORCH_XLA"] = "0"
    args = [str(script), "--deepspeed_config", str(config), "--steps", str(steps), "--losses-out",
            str(losses_file), *map(str, extra_args)]
    if launcher not in ("python", "deepspeed"):
        raise ValueError(f"unknown launcher {launcher!r}: expected 'python' or 'deepspeed'")
    if launcher == "python" and world_size != 1:
        raise ValueError("launcher='python' starts a single rank; use launcher='deepspeed' for more")
    if hosts > 1 and (launcher != "deepspeed" or world_size % hosts):
        raise ValueError(f"{world_size} ranks over {hosts} hosts: several hosts need launcher='deepspeed' and "
                         "the same number of ranks on each")
    port = free_port()  # reserved until run_in_session ends
    if launcher == "python":
        env.update(single_rank_env(port))
        cmd = [sys.executable, *args]
    else:
        cmd = deepspeed_command(["--num_gpus", str(world_size)], args, port)
    if hosts == 1:
        run = run_in_session(cmd, env, workdir, workdir / f"train-{label}.log", timeout, port=port)
        left_behind = {}
    else:  # the same launcher command, from host 0 of a bed, with a hostfile for its resources
        with multihost.HostBed(hosts, workdir / f"hosts-{label}") as bed:
            hostfile = bed.hostfile(workdir / f"hostfile-{label}", world_size // hosts)
            cmd = hostfile_command(bed, hostfile, args, port, workdir)
            run = run_in_session(cmd, bed.client_env(env), workdir, workdir / f"train-{label}.log", timeout, port=port)
            left_behind = bed.left_behind()
    if run.returncode != 0 or not losses_file.exists():
        who = "the CPU reference" if candidate is None else f"candidate {candidate.text}"
        ending = (f"trained to the end (its losses written) but did not exit within {timeout}s: a process of it hung at "
                  "exit" if run.timed_out and losses_file.exists() else
                  f"timed out after {timeout}s" if run.timed_out else
                  f"was killed by {signal.Signals(-run.returncode).name}" if run.returncode < 0 else
                  f"exited {run.returncode}" if run.returncode else "exited 0 without writing its losses")
        error = logs.last_error_line(run.log)
        raise TrainingFailed(f"{Path(script).name} with {Path(config).name} on {world_size} rank(s), {who}, "
                             f"{ending}{f' ({error})' if error else ''}; log tail:\n{logs.tail(run.log)}")
    result = json.loads(losses_file.read_text())
    return TrainingRun(losses=result.pop("losses"), device=result.pop("device"), log=run.log,
                       compilations=result.pop("compilations", None), reported=result, left_behind=left_behind)
