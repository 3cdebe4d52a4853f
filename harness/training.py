"""Run a fixture training script under an accelerator and compare loss curves.

One runner serves the project's tests and the conformance suites: it starts the script
the way a user would (`python script.py` with torch.distributed's environment for one
rank, or DeepSpeed's own `deepspeed --num_gpus N` launcher), reads the per-step losses
the script writes, and compares a candidate curve with a reference curve against the
tolerance table in fixtures/tolerances.toml.
"""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from .candidates import AT_START_ENV, SPEC_ENV

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
TOLERANCES = FIXTURES / "tolerances.toml"
TRAINING_CASES = FIXTURES / "training_cases.toml"


DEEPSPEED_RUNNER = ("-m", "deepspeed.launcher.runner")


class TrainingFailed(RuntimeError):
    """The script exited non-zero or wrote no losses; the message carries its log tail."""


@dataclasses.dataclass
class TrainingRun:
    losses: list
    device: str
    log: str


@dataclasses.dataclass(frozen=True)
class TrainingCase:
    """One row of fixtures/training_cases.toml: a script trained with a config on some ranks."""
    area: str
    id: str
    script: str  # relative to fixtures/
    config: str  # relative to fixtures/
    precision: str  # a table of fixtures/tolerances.toml
    ranks: int
    steps: int
    args: tuple = ()

    @property
    def sources(self):
        """The fixture files the case's losses depend on (besides the installed stack)."""
        return (self.script, self.config)

    def run(self, candidate, workdir, timeout=600):
        """Train this case on `candidate` (None: DeepSpeed's CPU accelerator)."""
        return run_training(FIXTURES / self.script, FIXTURES / self.config, candidate, workdir,
                            world_size=self.ranks, steps=self.steps,
                            launcher="python" if self.ranks == 1 else "deepspeed", extra_args=self.args,
                            timeout=timeout)


def training_areas(path=TRAINING_CASES):
    """The areas with a table in fixtures/training_cases.toml."""
    return list(tomllib.loads(Path(path).read_text()))


def training_cases(area, path=TRAINING_CASES):
    """The cases of `area` in fixtures/training_cases.toml, in file order."""
    table = tomllib.loads(Path(path).read_text())[area]
    return [TrainingCase(area=area, id=case_id, script=fields.get("script", table["script"]),
                         config=fields["config"], precision=fields["precision"], ranks=fields["ranks"],
                         steps=fields.get("steps", table["steps"]), args=tuple(fields.get("args", ())))
            for case_id, fields in table["cases"].items()]


@dataclasses.dataclass
class Launch:
    returncode: int
    log: str
    seconds: float
    timed_out: bool = False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env():
    """torch.distributed's environment for one rank started as `python script.py` (as torchrun
    would set it), on a free local port."""
    return dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port()))


def run_in_session(cmd, env, workdir, log_path, timeout):
    """Run `cmd` in its own session and, whatever happens (exit, failure, timeout), kill the
    whole session before returning, so no rank a launcher started outlives the run."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    return Launch(proc.returncode, Path(log_path).read_text(), time.monotonic() - start, timed_out)


def deepspeed_command(resources, script_args, runner=DEEPSPEED_RUNNER):
    """`deepspeed RESOURCES --master_port P SCRIPT_ARGS` on a free port (`python -m` the runner,
    so the command does not depend on PATH)."""
    return [sys.executable, *runner, *resources, "--master_port", str(free_port()), *map(str, script_args)]


def accelerator_env(candidate, extra=None):
    """Environment for a process that runs on `candidate` (a CandidateSpec, installed at
    interpreter start) or, when None, on DeepSpeed's CPU accelerator (the reference): this
    process's environment plus `extra`, on PJRT CPU unless told otherwise, unbuffered so a log
    tail shows the last thing a rank said."""
    env = dict(os.environ, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"), PYTHONUNBUFFERED="1", **(extra or {}))
    env.pop(SPEC_ENV, None)
    env.pop(AT_START_ENV, None)
    return dict(env, DS_ACCELERATOR="cpu") if candidate is None else candidate.child_env(env, at_start=True)


def launch(script_args, candidate, workdir, *, num_gpus=None, include=None, env=None, timeout=600,
           runner=DEEPSPEED_RUNNER):
    """`deepspeed [--num_gpus N | --include ...] --master_port P script_args` on `candidate`
    (None: DeepSpeed's CPU accelerator); `env` adds to the environment."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    resources = ["--num_gpus", str(num_gpus)] if num_gpus is not None else []
    if include is not None:
        resources = ["--include", include]
    label = "cpu" if candidate is None else candidate.name
    return run_in_session(deepspeed_command(resources, script_args, runner), accelerator_env(candidate, env), workdir,
                          workdir / f"launch-{label}-{time.monotonic_ns()}.log", timeout)


def run_training(script, config, candidate, workdir, *, world_size=1, steps=6, launcher="python",
                 extra_args=(), extra_env=None, timeout=600):
    """Train `script` with DeepSpeed config `config` on `candidate` (a CandidateSpec), or on
    DeepSpeed's CPU accelerator (the reference) when candidate is None.

    launcher="python": one rank, started as `python script.py` with RANK/WORLD_SIZE/...
    set (how torchrun-style jobs start a rank). launcher="deepspeed": DeepSpeed's own
    launcher with `--num_gpus world_size`.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    label = f"{'cpu' if candidate is None else 'candidate'}-{time.monotonic_ns()}"
    losses_file = workdir / f"losses-{label}.json"
    losses_file.unlink(missing_ok=True)
    env = accelerator_env(candidate, extra_env)
    args = [str(script), "--deepspeed_config", str(config), "--steps", str(steps), "--losses-out",
            str(losses_file), *map(str, extra_args)]
    if launcher == "python":
        if world_size != 1:
            raise ValueError("launcher='python' starts a single rank; use launcher='deepspeed' for more")
        env.update(single_rank_env())
        cmd = [sys.executable, *args]
    elif launcher == "deepspeed":
        cmd = deepspeed_command(["--num_gpus", str(world_size)], args)
    else:
        raise ValueError(f"unknown launcher {launcher!r}: expected 'python' or 'deepspeed'")
    run = run_in_session(cmd, env, workdir, workdir / f"train-{label}.log", timeout)
    if run.returncode != 0 or not losses_file.exists():
        tail = "\n".join(run.log.strip().splitlines()[-25:])
        who = "the CPU reference" if candidate is None else f"candidate {candidate.text}"
        ending = (f"timed out after {timeout}s" if run.timed_out else
                  f"was killed by {signal.Signals(-run.returncode).name}" if run.returncode < 0 else
                  f"exited {run.returncode}" if run.returncode else "exited 0 without writing its losses")
        error = last_error_line(run.log)
        raise TrainingFailed(f"{Path(script).name} with {Path(config).name} on {world_size} rank(s), {who}, "
                             f"{ending}{f' ({error})' if error else ''}; log tail:\n{tail}")
    result = json.loads(losses_file.read_text())
    return TrainingRun(losses=result["losses"], device=result["device"], log=run.log)


_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")


def last_error_line(log):
    """The last `SomeError: message` line of a log (rank prefixes dropped, cut to 300 characters),
    so the first line of a failure says what went wrong; None when there is none."""
    for line in reversed(log.splitlines()):
        match = _ERROR_LINE.match(line.strip())
        if match:
            return match.group(1)[:300]
    return None


def tolerance(precision, device=None):
    """(rtol, atol) for 'fp32' or 'bf16' from fixtures/tolerances.toml: the device's row of that
    precision where it has one (e.g. [fp32.tpu]), else the precision's own. `device` defaults to
    this run's PJRT_DEVICE."""
    table = tomllib.loads(TOLERANCES.read_text())
    if precision not in table:
        raise KeyError(f"no tolerance for precision {precision!r} in {TOLERANCES}; have {sorted(table)}")
    device = (device or os.environ.get("PJRT_DEVICE", "CPU")).lower()
    row = table[precision].get(device, table[precision])
    return row["rtol"], row["atol"]


def compare_losses(reference, candidate, precision):
    """Evidence dict: ok, max abs/rel error, tolerance, first diverging step, both curves."""
    rtol, atol = tolerance(precision)
    abs_err = [abs(c - r) for r, c in zip(reference, candidate)]
    rel_err = [e / abs(r) if r else e for e, r in zip(abs_err, reference)]
    diverging = [i for i, (e, r) in enumerate(zip(abs_err, reference)) if e > atol + rtol * abs(r)]
    same_length = len(reference) == len(candidate)
    return {
        "ok": same_length and not diverging,
        "steps": len(reference),
        "candidate_steps": len(candidate),
        "max_abs_err": max(abs_err, default=0.0),
        "max_rel_err": max(rel_err, default=0.0),
        "rtol": rtol,
        "atol": atol,
        "first_diverging_step": diverging[0] if diverging else None,
        "reference": list(reference),
        "candidate": list(candidate),
    }


def describe_mismatch(evidence, what, reference="the CPU reference"):
    """One paragraph a reader understands without the test: where and by how much."""
    if evidence["steps"] != evidence["candidate_steps"]:
        return f"{what}: candidate logged {evidence['candidate_steps']} steps, reference {evidence['steps']}"
    step = evidence["first_diverging_step"]
    return (f"{what}: loss diverges from {reference} at step {step} "
            f"(reference {evidence['reference'][step]!r}, candidate {evidence['candidate'][step]!r}); "
            f"max rel err {evidence['max_rel_err']:.3g} over {evidence['steps']} steps, "
            f"tolerance rtol={evidence['rtol']:g} atol={evidence['atol']:g}")
