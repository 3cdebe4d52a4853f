"""Before DeepSpeed's multi-node runner starts anything: every host of the run answers over ssh, in the working
directory, with this Python and the packages a rank imports.

DeepSpeed checks the first host only (`ssh HOST hostname`). A later host that cannot be reached, or whose
environment lacks torch_xla, shows as the other hosts' ranks waiting for their peers, until the rendezvous
times out (`DEEPSPEED_TIMEOUT`, 30 minutes by default), with pdsh's line about that host among theirs. So, in
the runner parent (`check_hosts`, from launch.py), each host of the run gets one ssh session, all at once. It
goes where DeepSpeed's launcher will (the same working directory, this interpreter by path, as the runner starts
every host's launcher) and finds DeepSpeed, torch_xla and this package there without importing them. A host that
fails stops the run before anything starts: one line naming each such host, what failed and what to do.

The check follows the runner's own options: none with `--no_ssh_check` or `--no_ssh`, and none for launchers
other than pdsh (MPI and Slurm start ranks their own way); `--ssh_port` is used.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

MODULES = ("deepspeed", "torch_xla", "deepspeed_xla")
ANSWER_S = 60  # for every host together: ssh's connection and the probe (no import: well under a second)
CONNECT_TIMEOUT_S = 20
# A directory without the package's files (a half-removed install) imports as an empty namespace package: missing.
_PROBE = ("import importlib.util as u; "
          f"print('missing:', *[m for m in {MODULES!r} if getattr(u.find_spec(m), 'origin', None) is None])")
_NO_DIRECTORY, _NO_PYTHON = 96, 97  # the probe's exit statuses for those


class HostCheckFailed(SystemExit):
    """A host of the run cannot start its ranks: one line (its message), exit status 1."""

    def __init__(self, line):
        super().__init__(line)


def active_hosts(args):
    """The hosts a multi-node run will start ranks on (DeepSpeed's hostfile after --include/--exclude and
    --num_nodes), in hostfile order; empty for a single-node run."""
    from deepspeed.launcher import runner
    pool = runner.fetch_hostfile(args.hostfile)
    if not pool:
        return []
    hosts = list(runner.parse_inclusion_exclusion(pool, args.include, args.exclude))
    return hosts[:args.num_nodes] if args.num_nodes > 0 else hosts


def _remote_command(cwd, python):
    exports = "".join(f"export {name}={shlex.quote(os.environ[name])}; " for name in ("PYTHONPATH", "PYTHONHOME")
                      if name in os.environ)
    return (f"{exports}cd {shlex.quote(cwd)} 2>/dev/null || exit {_NO_DIRECTORY}; "
            f"test -x {shlex.quote(python)} || exit {_NO_PYTHON}; exec {shlex.quote(python)} -c {shlex.quote(_PROBE)}")


def _verdict(host, returncode, out, err, cwd, python):
    """What is wrong with `host` from its probe's outcome, or None."""
    if returncode is None:
        return f"{host}: no answer over ssh within {ANSWER_S}s"
    if returncode == _NO_DIRECTORY:
        return f"{host}: no directory {cwd} (the training code must be at the same path on every host)"
    if returncode == _NO_PYTHON:
        return f"{host}: no Python at {python} (every host needs the same environment at the same path)"
    if returncode == 255 or not out.startswith("missing:"):
        said = (err.strip().splitlines() or [f"ssh exited {returncode}"])[-1]
        return f"{host}: not reachable over ssh ({said}), `ssh {host} hostname` must work from this host without a prompt"
    missing = out.split()[1:]
    if missing:
        return (f"{host}: {python} cannot import {', '.join(missing)} (install the same environment on every host: "
                "pip install 'deepspeed-xla[tpu]')")
    return None


def check_hosts(args, cwd=None, python=None):
    """Probe every host of the run over ssh (all at once); HostCheckFailed (exit 1, one line) naming each host
    that cannot start its ranks and why. A no-op for single-node runs and where the runner's options say so.
    `args`: the runner's parsed arguments."""
    if args.no_ssh_check or args.no_ssh or args.launcher.lower() != "pdsh":
        return
    hosts = active_hosts(args)
    if not hosts:
        return
    cwd, python = cwd or os.path.abspath("."), python or sys.executable
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
           *(["-p", str(args.ssh_port)] if args.ssh_port is not None else [])]
    probes = {host: subprocess.Popen([*ssh, host, _remote_command(cwd, python)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for host in hosts}
    deadline = time.monotonic() + ANSWER_S
    problems = []
    for host, probe in probes.items():
        try:
            out, err = probe.communicate(timeout=max(0.0, deadline - time.monotonic()))
            returncode = probe.returncode
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.communicate()
            out, err, returncode = "", "", None
        problem = _verdict(host, returncode, out.strip(), err, cwd, python)
        if problem:
            problems.append(problem)
    if problems:
        raise HostCheckFailed(f"deepspeed: {len(problems)} of {len(hosts)} hosts in {args.hostfile} cannot start "
                              f"ranks, nothing was started: {'; '.join(problems)}")
