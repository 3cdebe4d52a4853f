"""What `DS_ACCELERATOR=xla deepspeed ...` needs beyond DeepSpeed's own launcher.

DeepSpeed's launcher is used as it is: `deepspeed` (runner.py) resolves the resources and
starts `deepspeed.launcher.launch`, which starts one worker per device with RANK,
LOCAL_RANK, WORLD_SIZE and LOCAL_SIZE set. Three things are added, without touching
DeepSpeed's files (installed at interpreter start, patches/__init__.py):

* In the runner parent (`wrap_runner_main`):
  - the `.deepspeed_env` file (or the file named by DS_ENV_FILE), looked up in the
    home directory and then the working directory as DeepSpeed does on its multi-node
    path, is applied to the environment of the run on a single node too, later files
    and the file's values winning over the inherited environment, as DeepSpeed's
    exports do on remote nodes;
  - on the multi-node path, before anything starts (multinode.py): on a TPU slice the
    hostfile must list the workers in worker-id order, and every host of the run is
    probed over ssh; one line names each host that cannot start its ranks;
  - on PJRT CPU, where devices are emulated (one OS process per rank), the emulated
    device count covers the slots that `--include`/`--exclude` name, so that
    `deepspeed --include localhost:0,1` works like `--num_gpus 2`.
  Neither step starts the XLA runtime: the parent must leave the devices to the workers.

* In the runner and in launch.py (`is_launcher_parent`), the accelerator DeepSpeed loads
  answers the launcher's host-side questions only, and torch_xla is not imported.

* In each worker, before torch_xla is imported: on a TPU host, the per-process topology
  PyTorch/XLA's own spawn would give that process (one chip per process, its own port, its
  task id): backend/pjrt_env.py.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping, MutableMapping

from xla_host import discovery
from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend.pjrt_env import apply_tpu_worker_env
from . import multinode

ENV_FILE_VARIABLE = "DS_ENV_FILE"
DEFAULT_ENV_FILE = ".deepspeed_env"


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
    multinode.check_worker_order(args, environ)
    multinode.check_hosts(args)
    if discovery.device_type(environ) != "CPU":
        return
    needed = slots_needed(getattr(args, "include", ""), getattr(args, "exclude", ""))
    if needed > discovery.local_device_count(environ):
        # Emulated devices: as many as the slots asked for, for this runner and its workers
        # (whose own count comes from LOCAL_SIZE once the launcher has set it).
        environ[discovery.CPU_DEVICES_ENV] = str(needed)


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
LAUNCH_MODULE = "deepspeed.launcher.launch"  # what the runner starts on each node, to start the workers
RUNNER_SCRIPTS = ("deepspeed", "deepspeed.pt", "ds")  # DeepSpeed's bin/ scripts that run the runner
_OPTIONS_WITH_VALUE = ("-W", "-X")  # interpreter options whose value is the next argument


def is_launcher_parent(argv: list[str] | None = None) -> bool:
    """Whether this process is one of DeepSpeed's launcher processes, from its command line (`argv`, default
    `sys.orig_argv`: the interpreter's own, before `-m` rewrites sys.argv): `python -m deepspeed.launcher.runner|launch`,
    or one of DeepSpeed's runner scripts (`deepspeed`, `ds`). These resolve resources and start workers, and never
    touch a device."""
    args = iter((sys.orig_argv if argv is None else argv)[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None) in (RUNNER_MODULE, LAUNCH_MODULE)
        if arg.startswith("-m"):
            return arg[2:] in (RUNNER_MODULE, LAUNCH_MODULE)
        if arg in _OPTIONS_WITH_VALUE:
            next(args, None)
        elif arg == "-" or arg.startswith("-c") or not arg.startswith("-"):
            return os.path.basename(arg) in RUNNER_SCRIPTS
    return False


# The `deepspeed` console script imports the runner (main is wrapped as it loads);
# `python -m deepspeed.launcher.runner` has runpy ask for its code instead.
_RUNNER_HOOK = PostImportHook(RUNNER_MODULE, wrap_runner_main,
                              on_run_as_main=lambda: prepare_runner_from_argv(sys.argv[1:]))


def install() -> None:
    """Called at interpreter start in every DS_ACCELERATOR=xla process (before DeepSpeed
    or the XLA runtime): applies a TPU worker's topology, and arms the runner hook."""
    apply_tpu_worker_env()
    arm(_RUNNER_HOOK)
