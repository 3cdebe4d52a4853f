"""The multi-host test bed (harness/multihost.py) and the runner parent's probe of every host
(deepspeed_xla/patches/multinode.py), on real network namespaces, sshd and pdsh: hosts that look like hosts (and, on
request, like a TPU slice's workers), that see only their own processes, and that leave nothing behind, also
when their owner dies."""

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import multihost

REASON = multihost.unavailable()
# In CI the bed must run (its packages are installed by tox's set-up): a skip there would be a lost check.
pytestmark = pytest.mark.skipif(REASON is not None and os.environ.get("CI") != "true", reason=str(REASON))


def _on(bed, index, command, cwd="/", timeout=60):
    return subprocess.run(bed.on_host(index, ["sh", "-c", command], cwd), env=bed.client_env(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def _bed_namespaces():
    return [name for names in multihost._bed_namespaces().values() for name in names]


def test_hosts_have_their_own_names_addresses_and_sshd(tmp_path):
    assert REASON is None, REASON
    with multihost.HostBed(2, tmp_path) as bed:
        seen = {host.name: _on(bed, 0, f"ssh {host.name} 'hostname; hostname -i; ip -4 -o addr show eth0'")
                for host in bed.hosts}
        pdsh = _on(bed, 0, "PDSH_RCMD_TYPE=ssh pdsh -S -w host0,host1 hostname")
    for host in bed.hosts:
        out = seen[host.name]
        assert out.returncode == 0, f"ssh {host.name} from host0 failed: {out.stderr}"
        name, address, interface = out.stdout.strip().splitlines()
        assert (name, address) == (host.name, host.address) and f"inet {host.address}/" in interface, (
            f"{host.name} says it is {name} at {address} ({interface})")
    assert pdsh.returncode == 0 and sorted(pdsh.stdout.split("\n")[:-1]) == ["host0: host0", "host1: host1"], (
        f"pdsh over both hosts: exit {pdsh.returncode}, {pdsh.stdout!r} {pdsh.stderr!r}")


def test_hosts_see_only_their_own_processes(tmp_path):
    # DeepSpeed's runner stops a multi-node run with `pkill -f` on every host: on the bed it must reach that
    # host's processes only, as on separate machines
    with multihost.HostBed(2, tmp_path) as bed:
        started = _on(bed, 0, "ssh host1 'nohup sleep 600 >/dev/null 2>&1 & echo started'")
        assert started.stdout.strip() == "started", started.stderr
        on_host0 = _on(bed, 0, "pgrep -x sleep || echo none")
        _on(bed, 0, "pkill -x sleep")
        still = bed.processes()["host1"]
    assert on_host0.stdout.strip() == "none", f"host0 sees host1's process: {on_host0.stdout}"
    assert any("sleep 600" in cmdline for _, cmdline in still), f"pkill on host0 killed host1's process: {still}"


def test_stop_leaves_nothing_also_on_an_exception(tmp_path):
    before = set(_bed_namespaces())
    with pytest.raises(RuntimeError, match="the check failed"):
        with multihost.HostBed(2, tmp_path) as bed:
            _on(bed, 0, "ssh host1 'nohup sleep 600 >/dev/null 2>&1 &'; nohup sleep 600 >/dev/null 2>&1 &")
            pids = [pid for listed in bed.processes().values() for pid, _ in listed]
            sshds = [pid for host in bed.hosts for pid in (host.sshd.pid, host.sshd_pid)]
            raise RuntimeError("the check failed")
    assert len(pids) >= 2, "the processes to leave behind did not start"
    alive = [pid for pid in pids + sshds if multihost._alive(pid)]
    assert not alive, f"processes of a stopped bed still run: {alive}"
    assert set(_bed_namespaces()) == before, f"namespaces left: {set(_bed_namespaces()) - before}"


def test_bed_of_a_killed_owner_is_removed_by_the_next(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from harness import multihost
        bed = multihost.HostBed(2, {str(tmp_path / 'abandoned')!r})
        bed.start()
        print(bed.hosts[0].sshd_pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        sshd = int(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait()
    left = multihost._bed_namespaces(owner.pid)[owner.pid]
    assert len(left) == 3, f"a SIGKILLed owner's bed should still be there before the next one starts: {left}"
    with multihost.HostBed(1, tmp_path / "next"):
        assert multihost._bed_namespaces(owner.pid)[owner.pid] == [], "the abandoned bed's namespaces are still there"
    assert not multihost._alive(sshd), "the abandoned bed's sshd still runs"


def test_hidden_paths_are_empty_on_their_host_only(tmp_path):
    package = tmp_path / "site" / "some_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    with multihost.HostBed(2, tmp_path / "bed", hide={1: [package]}) as bed:
        listed = {host.name: _on(bed, 0, f"ssh {host.name} 'ls {package}'").stdout.split() for host in bed.hosts}
    assert listed == {"host0": ["__init__.py"], "host1": []}, listed


def test_tpu_hosts_are_the_workers_of_one_slice(tmp_path):
    # what every process on a host reads without starting a runtime: chips on its PCI bus, its metadata
    detect = ("from xla_host import tpu_topology as t; topology = t.detect_topology(); "
              "print(t.count_tpu_chips(), topology.accelerator_type, topology.worker_id, *topology.worker_ips)")
    repo = Path(__file__).resolve().parents[1]
    with multihost.HostBed(2, tmp_path, tpu=True) as bed:
        seen = [subprocess.run(bed.on_host(i, [sys.executable, "-c", detect], repo), capture_output=True, text=True,
                               timeout=60) for i in range(2)]
        addresses = [host.address for host in bed.hosts]
        servers = [host.metadata_server.pid for host in bed.hosts]
        left = bed.processes()
    for worker, out in enumerate(seen):
        assert out.stdout.split() == ["4", "v4-16", str(worker), *addresses], (
            f"host{worker} sees {out.stdout!r} {out.stderr[-1500:]}")
    assert not any(left.values()), f"the metadata servers count as processes left on the hosts: {left}"
    assert not any(multihost._alive(pid) for pid in servers), "a metadata server outlived its bed"


PROBE_HOSTS = textwrap.dedent("""
    import sys
    from deepspeed.launcher import runner
    from deepspeed_xla.patches import multinode
    try:
        multinode.check_hosts(runner.parse_args(sys.argv[1:] + ["train.py"]))
        print("ok")
    except SystemExit as stop:
        print(stop.code)
""")


def _check_hosts(bed, workdir, hostfile_lines, *options):
    hostfile = workdir / "hostfile"
    hostfile.write_text("".join(f"{line}\n" for line in hostfile_lines))
    cmd = bed.on_host(0, [sys.executable, "-c", PROBE_HOSTS, "--hostfile", hostfile, *options], workdir)
    done = subprocess.run(cmd, env=bed.client_env(os.environ), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_runner_parent_names_every_host_that_cannot_start_ranks(tmp_path):
    workdir = tmp_path / "code" / "train"  # on host2 "code" is empty: the training code is not there
    workdir.mkdir(parents=True)
    (workdir / "train.py").write_text("")
    torch_xla = Path(importlib.util.find_spec("torch_xla").origin).parent
    # host3 has the directory, but not the script in it (a stale or partial copy)
    with multihost.HostBed(4, tmp_path / "bed", hide={1: [torch_xla], 2: [workdir.parent], 3: [workdir]}) as bed:
        unreachable = str(multihost.SUBNET[9])
        hosts = ["host0 slots=2", "host1 slots=2", "host2 slots=2", "host3 slots=2", f"{unreachable} slots=2"]
        started = time.monotonic()
        verdict = _check_hosts(bed, workdir, hosts)
        seconds = time.monotonic() - started
        fine = _check_hosts(bed, workdir, hosts[:1])
        typo = _check_hosts(bed, workdir, hosts[:1], "--master_addr", "hots0")
        skipped = {option: _check_hosts(bed, workdir, hosts, *option.split())
                   for option in ("--no_ssh_check", "--launcher openmpi", "--exclude host1")}
    assert verdict.startswith(f"deepspeed: 4 of 5 hosts in {workdir / 'hostfile'} cannot start ranks"), verdict
    problems = verdict.split("nothing was started: ", 1)[1].split("; ")
    assert [problem.split(":", 1)[0] for problem in problems] == ["host1", "host2", "host3", unreachable], verdict
    assert "cannot import torch_xla" in problems[0], problems[0]
    assert f"no directory {workdir}" in problems[1], problems[1]
    assert f"no train.py in {workdir}" in problems[2], problems[2]
    assert "not reachable over ssh" in problems[3] and "No route to host" in problems[3], problems[3]
    assert seconds < 60, f"the hosts were probed one after another ({seconds:.0f} s)"
    assert fine == "ok", f"a reachable host with the environment was refused: {fine}"
    assert "host0: cannot resolve the master address hots0" in typo, typo
    assert skipped["--no_ssh_check"] == "ok" and skipped["--launcher openmpi"] == "ok", skipped
    assert "host1" not in skipped["--exclude host1"] and "4 of 5" not in skipped["--exclude host1"], skipped
