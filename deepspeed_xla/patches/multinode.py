"""Before DeepSpeed's multi-node runner starts anything: every host of the run answers over ssh, in the working
directory, with this Python and the packages a rank imports.

DeepSpeed checks the first host only (`ssh HOST hostname`). A later host that cannot be reached, or whose
environment lacks torch_xla, shows as the other hosts' ranks waiting for their peers, until the rendezvous
times out (`DEEPSPEED_TIMEOUT`, 30 minutes by default), with pdsh's line about that host among theirs. So, in
the runner parent (`check_hosts`, from launch.py), each host of the run gets one ssh session, all at once. It
goes where DeepSpeed's launcher will (the same working directory, this interpreter by path, as the runner starts
every host's launcher), finds DeepSpeed, torch_xla and this package there without importing them, finds the
training script, and resolves the master address. A host that
fails stops the run before anything starts: one line naming each such host, what failed and what to do.

On a TPU slice the hostfile must list the slice's hosts in worker-id order: ranks follow the hostfile
(rank = position x chips per host + local rank), and each worker's CLOUD_TPU_TASK_ID follows its worker id
(backend/pjrt_env.py), so the two numberings agree only in that order. `check_worker_order` compares the
hostfile with the slice's workers as this host's TPU metadata lists them (`worker-network-endpoints`), and
refuses another order, or hosts that are not the slice's, in one line that gives the order to write.

The ssh check follows the runner's own options: none with `--no_ssh_check` or `--no_ssh`, and none for launchers
other than pdsh (MPI and Slurm start ranks their own way); `--ssh_port` is used.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time

MODULES = ("deepspeed", "torch_xla", "deepspeed_xla")
ANSWER_S = 60  # for every host together: ssh's connection and the probe (no import: well under a second)
CONNECT_TIMEOUT_S = 20
# Run on each host with the training script and the master address: prints one JSON line. A directory without a
# package's files (a half-removed install) imports as an empty namespace package: missing.
_PROBE = f"""
import importlib.util, json, os, socket, sys
script, master = sys.argv[1:3]
try:
    socket.getaddrinfo(master, None)
    resolved = True
except OSError:
    resolved = False
print("probe:", json.dumps({{
    "missing": [m for m in {MODULES!r} if getattr(importlib.util.find_spec(m), "origin", None) is None],
    "script": not script or os.path.isfile(script), "master": resolved}}))
"""
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


def _remote_command(cwd, python, script, master):
    exports = "".join(f"export {name}={shlex.quote(os.environ[name])}; " for name in ("PYTHONPATH", "PYTHONHOME")
                      if name in os.environ)
    return (f"{exports}cd {shlex.quote(cwd)} 2>/dev/null || exit {_NO_DIRECTORY}; "
            f"test -x {shlex.quote(python)} || exit {_NO_PYTHON}; "
            f"exec {shlex.quote(python)} -c {shlex.quote(_PROBE)} {shlex.quote(script)} {shlex.quote(master)}")


def _verdict(host, returncode, out, err, cwd, python, script, master):
    """What is wrong with `host` from its probe's outcome, or None."""
    if returncode is None:
        return f"{host}: no answer over ssh within {ANSWER_S}s"
    if returncode == _NO_DIRECTORY:
        return f"{host}: no directory {cwd} (the training code must be at the same path on every host)"
    if returncode == _NO_PYTHON:
        return f"{host}: no Python at {python} (every host needs the same environment at the same path)"
    answer = next((line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("probe: ")), None)
    if returncode == 255 or answer is None:
        said = (err.strip().splitlines() or [f"ssh exited {returncode}"])[-1]
        return f"{host}: not reachable over ssh ({said}), `ssh {host} hostname` must work from this host without a prompt"
    found = json.loads(answer)
    problems = []
    if found["missing"]:
        problems.append(f"{python} cannot import {', '.join(found['missing'])} (install the same environment on "
                        "every host: pip install 'deepspeed-xla[tpu]')")
    if not found["script"]:
        problems.append(f"no {script} in {cwd} (the training code must be at the same path on every host)")
    if not found["master"]:
        problems.append(f"cannot resolve the master address {master} (--master_addr: host 0's address or a name "
                        "every host resolves)")
    return f"{host}: {', and '.join(problems)}" if problems else None


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
    # the script a rank runs (none to look for with --no_python or --module), and where every rank meets
    script = "" if args.no_python or args.module else args.user_script
    master = args.master_addr or hosts[0]
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
           *(["-p", str(args.ssh_port)] if args.ssh_port is not None else [])]
    probes = {host: subprocess.Popen([*ssh, host, _remote_command(cwd, python, script, master)], stdin=subprocess.DEVNULL,
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
        problem = _verdict(host, returncode, out.strip(), err, cwd, python, script, master)
        if problem:
            problems.append(problem)
    if problems:
        raise HostCheckFailed(f"deepspeed: {len(problems)} of {len(hosts)} hosts in {args.hostfile} cannot start "
                              f"ranks, nothing was started: {'; '.join(problems)}")


def _address(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host  # a name this host cannot resolve: compared as written, and named as such


def check_worker_order(args, environ=None, topology=None):
    """On a TPU host (chips on the PCI bus, PJRT_DEVICE TPU or unset) whose slice has several workers: refuse
    (HostCheckFailed, one line) a hostfile whose hosts are not the slice's workers in worker-id order.
    `topology` (an xla_host.tpu_topology.TpuTopology) replaces detection, for tests."""
    from xla_host import tpu_topology
    environ = os.environ if environ is None else environ
    if environ.get("PJRT_DEVICE", "TPU").strip().upper() not in ("TPU", ""):
        return
    hosts = active_hosts(args)
    if not hosts:
        return
    topology = topology or tpu_topology.detect_topology(environ)
    if topology is None or topology.num_hosts < 2:
        return
    addresses = [_address(host) for host in hosts]
    workers = list(topology.worker_ips)
    if addresses == workers:
        return
    listed = ", ".join(f"{host} ({address}, " + (f"worker {workers.index(address)})" if address in workers
                                                  else "not a worker of this slice)")
                       for host, address in zip(hosts, addresses))
    problem = ("out of worker-id order" if sorted(addresses) == sorted(workers) else
               f"not as the {len(workers)} workers of this {topology.accelerator_type} slice")
    raise HostCheckFailed(
        f"deepspeed: {args.hostfile} lists the TPU slice's hosts {problem}: {listed}; ranks follow the hostfile and "
        f"each worker's CLOUD_TPU_TASK_ID its worker id, so list every worker in worker-id order (as "
        f"worker-network-endpoints does): {', '.join(workers)}")

