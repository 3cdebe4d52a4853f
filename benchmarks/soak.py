"""Soak: many short multi-rank trainings in a row, on loaded cores, each with a deadline. Does every run end?

A short multi-rank DeepSpeed training on PJRT CPU sometimes finishes training but leaves a rank that never
exits (a GIL deadlock in torch_xla's exit handler). This runs RUNS consecutive trainings of fixtures/train.py
(STEPS steps, deepspeed_xla, DeepSpeed's launcher started as the harness starts it: `deepspeed_command` +
`run_in_session`, whose session is killed whole when the run ends), cycling over the rows (ZeRO 1-3 x fp32,
bf16 x 2 and 4 ranks), while one busy-looping process per core loads the machine (`--no-load`: none).

A run still going at its deadline is a hang: "finished, not exited" when rank 0 had written its losses
(training completed, a process of the run still alive), "in training" when it had not. The Python stacks of
the hung run's ranks are gathered before they are killed (`py-spy dump`; where that fails, the kernel's view:
each thread's wait channel and the process state) and printed under the table (in full for the first
STACKS_SHOWN hung runs, one line for each later one). After every run, any process
of that run still alive (one whose environment or command line carries the run's MASTER_PORT or marker, one
in the run's session, or a descendant of either) counts as left behind, and is killed. Every run's per-step
losses are compared bit for bit with the first run of its row that wrote losses.

Target: 0 hangs, 0 left behind, 0 failed runs, every row's losses identical.

    python -m harness bench --only soak -- --runs 24     (or: python benchmarks/soak.py --runs 24)
    --only 1-fp32-2,3-bf16 some rows, --deadline S per run (default 300), --no-load no load process
"""

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _script import run, selected_rows  # noqa: E402
from harness import logs  # noqa: E402
from harness.candidate import candidates  # noqa: E402
from harness.candidate.candidate_env import accelerator_env  # noqa: E402
from harness.launching import deepspeed_command, free_port, run_in_session  # noqa: E402
from harness.paths import FIXTURES  # noqa: E402
from harness.child_processes import dies_with_parent, interrupts_held  # noqa: E402

TRAIN = FIXTURES / "train.py"
STEPS = 6  # as the harness's training checks (run_training's default): a short run, most of it start-up
ROWS = [(stage, dtype, world) for stage in (1, 2, 3) for dtype in ("fp32", "bf16") for world in (2, 4)]
RUNS, DEADLINE_S = 200, 300
BACKSTOP_S = 120  # run_in_session's own timeout past the deadline, should gathering the stacks itself hang
PY_SPY_TIMEOUT_S = 30  # one `py-spy dump`; a deadlocked interpreter is read from outside and answers at once
SETTLE_S = 5.0  # how long a process of a finished run may take to go after its session was killed
STACKS_SHOWN = 2  # hung runs whose stacks are printed in full (a report keeps a table's last 8,000 characters)
MARKER = "HARNESS_SOAK_RUN"  # in every run's environment, which each process the launcher starts inherits
# One busy process per core; each extra one is forked by the first, so all share its process group, and each
# dies with the first (checked after the prctl: a first one gone before it would leave it spinning).
LOAD = """
import ctypes, os, signal, sys
first = os.getpid()
for _ in range(int(sys.argv[1]) - 1):
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        if os.getppid() != first:
            os._exit(0)
        break
while True:
    pass
"""


@dataclasses.dataclass
class Proc:
    """One process as /proc shows it."""
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str  # R, S, D, Z, ... (proc(5))
    cmdline: list
    environ: frozenset  # "NAME=value" entries; empty where it cannot be read


@dataclasses.dataclass
class RunResult:
    """One soak run: its row, its number (1-based), wall seconds, how it hung (None, "finished" or
    "training"), why it failed when it ended on its own without losses or non-zero (else None), the processes
    it left behind, its losses (None without them) and, when it hung, the stacks gathered (text)."""
    row: tuple
    number: int
    seconds: float
    hung: str | None
    failure: str | None
    left_behind: int
    losses: list | None
    stacks: str = ""


def row_name(row):
    """`STAGE-DTYPE-WORLD`, e.g. 1-fp32-2."""
    return "-".join(map(str, row))


def config_path(stage, dtype):
    """fixtures/configs/zeroSTAGE[_bf16].json."""
    return FIXTURES / "configs" / f"zero{stage}{'_bf16' if dtype == 'bf16' else ''}.json"


def _read_proc(pid):
    """The Proc for `pid`, or None when it has gone (or was never ours to read)."""
    base = Path("/proc") / str(pid)
    try:
        stat = (base / "stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
        cmdline = (base / "cmdline").read_bytes().decode(errors="replace").split("\0")
        try:
            environ = frozenset((base / "environ").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            environ = frozenset()
    except (OSError, ValueError):
        return None
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0], cmdline, environ)


def processes():
    """Every process /proc shows now, by pid."""
    procs = (_read_proc(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return {proc.pid: proc for proc in procs if proc is not None}


def _carries(proc, port, marker):
    """Whether `proc`'s environment or command line names the run: its marker or MASTER_PORT, or the
    launcher's `--master_port PORT` / `--master_port=PORT`."""
    if f"{MARKER}={marker}" in proc.environ or f"MASTER_PORT={port}" in proc.environ:
        return True
    args = proc.cmdline
    return f"--master_port={port}" in args or any(a == "--master_port" and b == str(port) for a, b in zip(args, args[1:]))


def run_members(port, marker, before=frozenset()):
    """Pids of the live processes of the run on `port` with `marker`: those that carry either, everything in
    their sessions (the launch's session leader runs it in a session of its own), and the descendants of all
    of these. Processes in `before` (carrying the port before the run began: someone else's) are left out,
    as are zombies (dead, waiting for a parent's wait()), this process, and its session."""
    procs = processes()
    members = {pid for pid, proc in procs.items() if pid not in before and _carries(proc, port, marker)}
    sessions = {procs[pid].sid for pid in members} - {os.getsid(0)}
    members |= {pid for pid, proc in procs.items() if proc.sid in sessions and pid not in before}
    grown = True
    while grown:
        children = {pid for pid, proc in procs.items() if proc.ppid in members and pid not in before} - members
        members |= children
        grown = bool(children)
    return sorted(pid for pid in members - {os.getpid()} if procs[pid].state not in ("Z", "X"))


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def clear_left_behind(port, marker, before):
    """After a run's session was killed: how many of its processes are still alive SETTLE_S seconds later
    (a killed process needs a moment to go); those are killed."""
    settle_until = time.monotonic() + SETTLE_S
    while (left := run_members(port, marker, before)) and time.monotonic() < settle_until:
        time.sleep(0.2)
    _kill(left)
    return len(left)


def _py_spy():
    """The py-spy executable beside this Python (the stack's environment), else on PATH; None without one."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _kernel_view(pid):
    """What the kernel says of a process that py-spy could not read: its state, thread count, and each
    thread's wait channel (the kernel function it sleeps in; futex_wait_queue for a lock or the GIL)."""
    base = Path("/proc") / str(pid)
    try:
        status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines() if ":" in line)
        channels = {}
        for task in sorted((base / "task").iterdir()):
            wchan = (task / "wchan").read_text().strip() or "-"  # "0" or empty: running or not sleeping
            channels[wchan] = channels.get(wchan, 0) + 1
    except OSError as err:
        return f"(gone: {err.strerror})"
    waits = ", ".join(f"{name} x{count}" for name, count in sorted(channels.items(), key=lambda item: -item[1]))
    return f"State {status.get('State', '?').strip()}, Threads {status.get('Threads', '?').strip()}; wait channels: {waits}"


def python_stack(pid):
    """`py-spy dump --pid PID`'s output (every thread's Python stack, which one holds the GIL); where py-spy is
    missing or fails, why, and the kernel's view of the process instead."""
    py_spy = _py_spy()
    if py_spy:
        try:
            dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=PY_SPY_TIMEOUT_S, preexec_fn=dies_with_parent)
            if dump.returncode == 0 and dump.stdout.strip():
                return dump.stdout.rstrip()
            why = (dump.stderr.strip().splitlines() or [f"exit {dump.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            why = f"no answer in {PY_SPY_TIMEOUT_S} s"
        why = f"py-spy failed ({why})"
    else:
        why = "py-spy not installed"
    return f"{why}; {_kernel_view(pid)}"


def _runs(args):
    """What a Python command line runs: the module after -m, or the script's name; None for neither."""
    for arg, after in zip(args[1:], args[2:] + [None]):
        if arg == "-m":
            return after
        if arg.endswith(".py"):
            return Path(arg).name
    return None


def _role(proc):
    """`rank N` for a training rank, else what the process runs (the launcher's parts, the session leader)."""
    args = [arg for arg in proc.cmdline if arg]
    rank = next((entry.split("=", 1)[1] for entry in proc.environ if entry.startswith("RANK=")), None)
    runs = _runs(args)
    if runs == TRAIN.name and rank is not None:
        return f"rank {rank}"
    return runs or Path(args[0] if args else "?").name


def gather_stacks(pids):
    """Text, one section per live process of a hung run: the ranks' Python stacks (python_stack), and one line
    for each other process (the launcher and its session leader, which only wait for the ranks)."""
    sections = []
    for pid in pids:
        proc = _read_proc(pid)
        if proc is None:
            continue
        role = _role(proc)
        if role.startswith("rank "):
            sections.append(f"  pid {pid}, {role}:\n" + "\n".join(f"    {line}" for line in python_stack(pid).splitlines()))
        else:
            sections.append(f"  pid {pid}, {role}: {_kernel_view(pid)}")
    return "\n".join(sections)


class Deadline(threading.Thread):
    """Watches one run: if any of its processes is still alive `deadline_s` after start, records how it hung
    ("finished" when `losses` exists, else "training"), gathers their stacks, then kills them, which ends
    run_in_session's wait in the main thread. stop() when the run has ended."""

    def __init__(self, port, marker, before, deadline_s, losses):
        super().__init__(daemon=True)
        self.port, self.marker, self.before, self.deadline_s, self.losses = port, marker, before, deadline_s, losses
        self.hung, self.stacks = None, ""
        self._ended = threading.Event()

    def run(self):
        if self._ended.wait(self.deadline_s):
            return
        pids = run_members(self.port, self.marker, self.before)
        if not pids:
            return
        self.hung = "finished" if self.losses.exists() else "training"
        self.stacks = gather_stacks(pids)
        # Their whole sessions first (the launch's, unless something left it), then any process still there.
        for pid in run_members(self.port, self.marker, self.before):
            try:
                if os.getsid(pid) != os.getsid(0):
                    os.killpg(os.getsid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _kill(run_members(self.port, self.marker, self.before))

    def stop(self):
        self._ended.set()
        self.join()


def soak_run(row, number, workdir, env, deadline_s):
    """One training of `row` started as the harness starts one (DeepSpeed's launcher in a session of its
    own), stopped at `deadline_s` seconds with its stacks gathered; a RunResult. Whatever ends it (an
    interrupt included), what it left behind is killed before this returns or raises."""
    stage, dtype, world = row
    losses = Path(workdir) / f"losses-{number}.json"
    port, marker = free_port(), f"{os.getpid()}-{number}"
    before = frozenset(run_members(port, marker))  # someone else's processes that happen to carry the port
    cmd = deepspeed_command(["--num_gpus", str(world)], [TRAIN, "--deepspeed_config", config_path(stage, dtype),
                                                         "--steps", STEPS, "--losses-out", losses], port)
    watch = Deadline(port, marker, before, deadline_s, losses)
    watch.start()
    try:
        launch = run_in_session(cmd, dict(env, **{MARKER: marker}), workdir, Path(workdir) / f"run-{number}.log",
                                deadline_s + BACKSTOP_S, port=port)
    finally:
        watch.stop()
        left = clear_left_behind(port, marker, before)
    hung = watch.hung or (("finished" if losses.exists() else "training") if launch.timed_out else None)
    result = _read_losses(losses)
    failure = None
    if not hung and (launch.returncode != 0 or result is None):
        how = f"exit {launch.returncode}" if launch.returncode else "exited 0 without writing its losses"
        failure = f"{how}: {logs.last_error_line(launch.log) or logs.tail(launch.log, 1) or '(no output)'}"
    stacks = watch.stacks or ("(stopped by the backstop; no stacks)" if launch.timed_out else "")
    return RunResult(row, number, launch.seconds, hung, failure, left, result, stacks)


def _read_losses(path):
    """The losses rank 0 wrote, or None (none written, or cut short by the kill)."""
    try:
        return json.loads(path.read_text())["losses"]
    except (OSError, ValueError, KeyError):
        return None


def start_load(count, started):
    """Start `count` busy-looping Python processes in a process group of their own (each dies with this
    process), and append the Popen of the first to `started`."""
    with interrupts_held():  # held until it is in `started`, where stop_load finds it
        started.append(subprocess.Popen([sys.executable, "-c", LOAD, str(count)], start_new_session=True,
                                        stdout=subprocess.DEVNULL, preexec_fn=dies_with_parent))


def stop_load(started):
    """Kill each started load's whole process group, and reap its first process."""
    for load in started:
        try:
            os.killpg(load.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        load.wait()


def _bits(losses):
    """The losses' exact bits, comparable with == (float.hex: NaN equals NaN, and no rounding)."""
    return [float(loss).hex() for loss in losses]


def differing_runs(results):
    """{run number: (its row's reference run number, first differing step)} for each run whose losses are
    not bit for bit those of the first run of its row that wrote losses."""
    reference, differing = {}, {}
    for result in results:
        if result.losses is None:
            continue
        first = reference.setdefault(result.row, result)
        mine, theirs = _bits(result.losses), _bits(first.losses)
        if mine != theirs:
            step = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            differing[result.number] = (first.number, step)
    return differing


def print_table(rows, results, differing):
    """The table: one line per row with at least one run."""
    print(f"{'row':<9} {'runs':>5} {'hangs':>6} {'not exited':>11} {'in training':>12} {'left behind':>12} "
          f"{'failed':>7}  {'losses identical':<17} {'median s':>9}")
    for row in rows:
        mine = [r for r in results if r.row == row]
        if not mine:
            continue
        hangs = [r for r in mine if r.hung]
        compared = [r for r in mine if r.losses is not None]
        differ = sum(r.number in differing for r in mine)
        identical = "-" if not compared else ("yes" if not differ else f"no ({differ} of {len(compared)})")
        ended = [r.seconds for r in mine if not r.hung]
        median = f"{statistics.median(ended):9.1f}" if ended else f"{'-':>9}"
        print(f"{row_name(row):<9} {len(mine):5d} {len(hangs):6d} {sum(r.hung == 'finished' for r in hangs):11d} "
              f"{sum(r.hung == 'training' for r in hangs):12d} {sum(r.left_behind for r in mine):12d} "
              f"{sum(r.failure is not None for r in mine):7d}  {identical:<17} {median}")


def print_details(results, differing):
    """Under the table: each hung run (its stacks, the first STACKS_SHOWN in full), each failed run, each run
    whose losses differ."""
    hung = [r for r in results if r.hung]
    for shown, result in enumerate(hung):
        what = "finished training but did not exit" if result.hung == "finished" else "hung in training"
        head = f"run {result.number} ({row_name(result.row)}): {what} at {result.seconds:.0f} s"
        if shown < STACKS_SHOWN:
            print(f"{head}; its live processes:\n{result.stacks}")
        else:
            print(f"{head} (stacks of the first {STACKS_SHOWN} hung runs only)")
    for result in results:
        if result.failure:
            print(f"run {result.number} ({row_name(result.row)}) failed: {result.failure}")
        if result.left_behind:
            print(f"run {result.number} ({row_name(result.row)}) left {result.left_behind} process(es) behind (killed)")
        if result.number in differing:
            reference, step = differing[result.number]
            print(f"run {result.number} ({row_name(result.row)}): losses differ from run {reference}'s from step {step}")


def verdict(results, differing, planned):
    """The verdict line and whether the target was met."""
    hangs = [r for r in results if r.hung]
    left = sum(r.left_behind for r in results)
    failed = sum(r.failure is not None for r in results)
    met = not hangs and not left and not failed and not differing
    ran = f"{len(results)} runs" + (f" of {planned} (interrupted)" if len(results) < planned else "")
    print(f"{ran}: {len(hangs)} hangs ({sum(r.hung == 'finished' for r in hangs)} finished but did not exit), "
          f"{left} left behind, {failed} failed, losses differ in {len(differing)}; "
          f"target 0 hangs, 0 left behind, 0 failed, identical losses: {'met' if met else 'missed'}"
          + (f" in the {len(results)} runs made, short of the {planned} planned" if len(results) < planned else ""))
    return met


def main():
    parser = argparse.ArgumentParser(description="Consecutive short multi-rank trainings on loaded cores, each "
                                     "with a deadline: hangs, processes left behind, identical losses")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs in all, cycling over the rows (default {RUNS})")
    parser.add_argument("--only", help="rows as STAGE-DTYPE or STAGE-DTYPE-WORLD, comma-separated (e.g. 1-fp32-2,3-bf16)")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help=f"seconds a run may take before it counts as hung (default {DEADLINE_S})")
    parser.add_argument("--no-load", action="store_true", help="no busy processes beside the runs")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: give 1 or more")
    if args.deadline <= 0:
        parser.error(f"--deadline {args.deadline:g}: give a number of seconds above 0")
    rows = ROWS if args.only is None else selected_rows(parser, args.only, ROWS)
    env = accelerator_env(candidates.parse_spec(candidates.DEFAULT_SPEC))
    cores = len(os.sched_getaffinity(0))
    print(f"soak: {args.runs} runs over {len(rows)} rows, {STEPS} steps each, deadline {args.deadline:g} s, "
          + ("no load" if args.no_load else f"{cores} busy processes beside"), file=sys.stderr, flush=True)
    results, loads, interrupted = [], [], False
    try:
        if not args.no_load:
            start_load(cores, loads)
        with tempfile.TemporaryDirectory(prefix="soak-") as workdir:
            for number in range(1, args.runs + 1):
                row = rows[(number - 1) % len(rows)]
                result = soak_run(row, number, workdir, env, args.deadline)
                results.append(result)
                state = (f"hung ({result.hung})" if result.hung else "failed" if result.failure else "ok") + (
                    f", {result.left_behind} left behind" if result.left_behind else "")
                print(f"soak: run {number}/{args.runs} {row_name(row)}: {state}, {result.seconds:.1f} s",
                      file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True  # the run's session was killed by run_in_session, its leftovers by soak_run
    finally:
        stop_load(loads)
    differing = differing_runs(results)
    print_table(rows, results, differing)
    print_details(results, differing)
    met = verdict(results, differing, args.runs)
    sys.stdout.flush()
    if interrupted:
        raise KeyboardInterrupt  # _script.run says so in one line and exits 130
    return 0 if met else 1


if __name__ == "__main__":
    run(main)
