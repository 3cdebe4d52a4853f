"""What `DS_ACCELERATOR=xla deepspeed ...` needs beyond DeepSpeed's own launcher.

DeepSpeed's launcher is used as it is: `deepspeed` (runner.py) resolves the resources and
starts `deepspeed.launcher.launch`, which starts one worker per device with RANK,
LOCAL_RANK, WORLD_SIZE and LOCAL_SIZE set. Three things are added, without touching
DeepSpeed's files (the activation hook calls them, see _activation.py):

* In the runner parent (`wrap_runner_main`):
  - the `.deepspeed_env` file (or the file named by DS_ENV_FILE), looked up in the
    home directory and then the working directory as DeepSpeed does on its multi-node
    path, is applied to the environment of the run on a single node too, later files
    and the file's values winning over the inherited environment, as DeepSpeed's
    exports do on remote nodes;
  - on PJRT CPU, where devices are emulated (one OS process per rank), the emulated
    device count covers the slots that `--include`/`--exclude` name, so that
    `deepspeed --include localhost:0,1` works like `--num_gpus 2`.
  Neither step starts the XLA runtime: the parent must leave the devices to the workers.

* In each worker, before torch_xla is imported (`apply_tpu_worker_env`): on a TPU host,
  the per-process topology PyTorch/XLA's own spawn would give that process (one chip per
  process, its own port, its task id), computed by `tpu_topology.worker_env` from the
  host's topology and LOCAL_RANK/LOCAL_SIZE. It overrides the TPU_VISIBLE_CHIPS=0,1,..
  that the launcher sets for all local ranks alike.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping, MutableMapping

from .import_hooks import PostImportHook, arm, wrap_once

ENV_FILE_VARIABLE = "DS_ENV_FILE"
DEFAULT_ENV_FILE = ".deepspeed_env"
# Set in a worker once its TPU topology is applied: "local_rank/local_size".
TPU_ENV_APPLIED = "DS_XLA_TPU_WORKER_ENV"


# -- the runner parent ----------------------------------------------------------------
def env_file_paths(environ: Mapping[str, str] | None = None, cwd: str | None = None,
                   home: str | None = None) -> list[str]:
    """The env files DeepSpeed's runner reads, in its order (home, then working dir), that exist."""
    environ = os.environ if environ is None else environ
    name = environ.get(ENV_FILE_VARIABLE, DEFAULT_ENV_FILE)
    folders = [home if home is not None else os.path.expanduser("~"), cwd if cwd is not None else "."]
    paths = []
    for folder in folders:
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.path.abspath(path) not in map(os.path.abspath, paths):
            paths.append(path)
    return paths


def parse_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines, as DeepSpeed reads them (split at the first '='); blank lines and
    '#' comments are skipped, the line end is not part of the value."""
    values = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            text = line.rstrip("\r\n")
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            if "=" not in text:
                raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {text!r}")
            key, value = text.split("=", 1)
            values[key.strip()] = value
    return values


def apply_env_files(environ: MutableMapping[str, str] | None = None, cwd: str | None = None,
                    home: str | None = None) -> dict[str, str]:
    """Apply every env file DeepSpeed would read to `environ`; returns what was set."""
    environ = os.environ if environ is None else environ
    applied = {}
    for path in env_file_paths(environ, cwd, home):
        applied.update(parse_env_file(path))
    environ.update(applied)
    return applied


def slots_needed(include: str, exclude: str = "") -> int:
    """Local device slots that --include/--exclude strings ('localhost:0,2@host2:1') name: the
    highest slot index plus one (0 when none is named)."""
    highest = -1
    for spec in (include, exclude):
        for entry in filter(None, (part.strip() for part in spec.split("@"))):
            _, _, slots = entry.partition(":")
            for slot in filter(None, (s.strip() for s in slots.split(","))):
                if not slot.isdigit():
                    raise ValueError(f"not a device slot: {slot!r} in {spec!r}")
                highest = max(highest, int(slot))
    return highest + 1


def prepare_runner_environment(args, environ: MutableMapping[str, str] | None = None) -> None:
    """Run in the `deepspeed` runner before DeepSpeed resolves resources (`args`: its parsed
    arguments). Never starts the XLA runtime."""
    environ = os.environ if environ is None else environ
    apply_env_files(environ)
    from . import runtime
    if runtime.device_type() != "CPU":
        return
    needed = slots_needed(getattr(args, "include", ""), getattr(args, "exclude", ""))
    if needed > runtime.local_device_count():
        # Emulated devices: as many as the slots asked for, for this runner and its workers
        # (whose own count comes from LOCAL_SIZE once the launcher has set it).
        environ[runtime.CPU_DEVICES_ENV] = str(needed)


def prepare_runner_from_argv(argv) -> None:
    """`prepare_runner_environment` for a runner started as `python -m deepspeed.launcher.runner ARGV`."""
    from deepspeed.launcher import runner
    prepare_runner_environment(runner.parse_args(list(argv)))


def wrap_runner_main(runner_module) -> None:
    """Make `deepspeed.launcher.runner.main` prepare the environment first (idempotent)."""
    if getattr(runner_module, "main", None) is None:
        return

    def wrap(original):

        @functools.wraps(original)
        def main(args=None):
            prepare_runner_environment(runner_module.parse_args(args))
            return original(args)

        return main

    wrap_once(runner_module, "main", wrap)


RUNNER_MODULE = "deepspeed.launcher.runner"  # what the `deepspeed` command runs


# The `deepspeed` console script imports the runner (main is wrapped as it loads);
# `python -m deepspeed.launcher.runner` has runpy ask for its code instead.
_RUNNER_HOOK = PostImportHook(RUNNER_MODULE, wrap_runner_main,
                              on_run_as_main=lambda: prepare_runner_from_argv(sys.argv[1:]))


def install_launcher_hooks() -> None:
    """Called at interpreter start in every DS_ACCELERATOR=xla process (before DeepSpeed
    or the XLA runtime): applies a TPU worker's topology, and arms the runner hook."""
    apply_tpu_worker_env()
    from . import checkpointing
    checkpointing.install()  # DeepSpeed checkpoints from XLA hold host tensors
    arm(_RUNNER_HOOK)


# -- each worker ----------------------------------------------------------------------
def apply_tpu_worker_env(environ: MutableMapping[str, str] | None = None, *, topology=None,
                         sysfs_root: str | None = None) -> dict[str, str] | None:
    """On a TPU host, give this launcher-started worker its one-chip topology; returns what was set.

    Does nothing (returns None) outside a launcher worker (no LOCAL_RANK and LOCAL_SIZE /
    LOCAL_WORLD_SIZE), when PJRT_DEVICE names another device kind, on a host without TPU
    chips, or when this process already has its worker env (children inherit it).
    Must run before the XLA runtime starts; it reads no torch_xla. `topology` (a
    tpu_topology.TpuTopology) replaces detection, for tests.
    """
    environ = os.environ if environ is None else environ
    local_rank = environ.get("LOCAL_RANK")
    local_size = environ.get("LOCAL_SIZE") or environ.get("LOCAL_WORLD_SIZE")
    if local_rank is None or local_size is None:
        return None
    kind = environ.get("PJRT_DEVICE", "").strip().upper()
    if kind and kind != "TPU":
        return None
    marker = f"{local_rank}/{local_size}"
    if environ.get(TPU_ENV_APPLIED) == marker:
        return None
    from . import tpu_topology
    if topology is None:
        kwargs = {} if sysfs_root is None else {"sysfs_root": sysfs_root}
        topology = tpu_topology.detect_topology(environ, **kwargs)
        if topology is None:
            return None
    try:
        values = tpu_topology.worker_env(topology, int(local_rank), int(local_size))
    except ValueError as error:
        raise RuntimeError(
            f"deepspeed_xla: rank with LOCAL_RANK={local_rank} of {local_size} local processes cannot be given "
            f"a TPU topology: {error} Start one process per chip (`deepspeed --num_gpus "
            f"{topology.chips_per_host}`, or no --num_gpus) or a single process.") from None
    environ.update(values)
    environ[TPU_ENV_APPLIED] = marker
    return values
