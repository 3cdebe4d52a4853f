"""Several hosts on one machine, for DeepSpeed's multi-node runner (`deepspeed --hostfile`, pdsh over ssh).

Each host of a `HostBed` is a Linux network namespace with one interface on a private subnet (the hosts
are joined by a bridge in a namespace of the bed's own), its own hostname (a UTS namespace), its own
/etc/hosts naming every host (a bind mount in its own mount namespace) and its own processes (a PID
namespace: `ps` or DeepSpeed's `pkill` on a host sees that host's only), so a rank that binds or resolves
the wrong address fails as it would on a pod, and a command aimed at one host's processes reaches no other.
Each host runs an sshd on port 22 of its address that accepts a key made for the bed. All hosts share the
file system: the same Python environment and code at the same path, as on a TPU slice prepared with
`gcloud ... --worker=all`.

With `tpu=True` the hosts are a 2x2x1-chip TPU v4 slice's workers in bed order (host0 is worker 0), as far as
anything that asks without starting a runtime can tell: each has 4 TPU chips on its PCI bus (a sysfs tree
mounted over /sys/bus/pci/devices) and a GCE metadata server at metadata.google.internal (169.254.169.254 on
the host) that answers that host's `tpu-env` (its worker id, the slice's type and bounds) and the slice's
`worker-network-endpoints`. No TPU runtime can start there: ranks that touch a device fail.

A command runs on host 0 through `on_host(0, cmd)` (it enters host 0's namespaces), with `client_env(env)`:
`ssh` on its PATH is the bed's, which uses the bed's key and known-hosts file. Nothing of the machine is
changed: no address of its own network, no file in /etc or ~/.ssh. `stop()` (or leaving the `with` block,
also on an exception or Ctrl-C) kills every process on every host and deletes the namespaces; a bed whose
owner died without stopping it is removed by the next bed started on the machine.

Needs Linux, root (namespaces, bind mounts, sshd), iproute2, util-linux, OpenSSH and pdsh: `unavailable()`
says what is missing; `ensure_packages()` installs the Debian packages (pdsh, openssh-server,
openssh-client) where they are missing.
"""

import contextlib
import dataclasses
import fcntl
import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = {"pdsh": "pdsh", "sshd": "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client"}
SBIN = ("/usr/sbin", "/sbin")
PREFIX = "dsxbed"  # namespace names: PREFIX-<owner pid>-<n>-<role>
SUBNET = ipaddress.ip_network("10.213.0.0/24")  # inside the bed's namespaces only: no host outside can see it
SSHD_START_S = 20
SETTLE_S = 10.0  # how long a host may take to end a finished session's processes
METADATA_ADDRESS = "169.254.169.254"  # GCE's, on each host's own loopback: reachable from that host only
TPU_CHIPS_PER_HOST_BOUNDS = (2, 2, 1)  # a TPU v4 host
TPU_CHIPS_PER_HOST = TPU_CHIPS_PER_HOST_BOUNDS[0] * TPU_CHIPS_PER_HOST_BOUNDS[1] * TPU_CHIPS_PER_HOST_BOUNDS[2]
_GOOGLE_PCI_VENDOR, _TPU_V4_PCI_DEVICE = "0x1ae0", "0x005e"
METADATA_SERVER = Path(__file__).with_name("metadata_server.py")
APT_LOCK = Path(tempfile.gettempdir()) / f"{PREFIX}-apt.lock"


class HostBedError(RuntimeError):
    """The bed could not be started; the message says which step failed and its output."""


def _which(name):
    return shutil.which(name) or next((f"{d}/{name}" for d in SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def unavailable():
    """Why no bed can start on this machine (one line), or None when one can."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return "a multi-host bed needs Linux network namespaces"
    if os.geteuid() != 0:
        return "a multi-host bed needs root (network namespaces, bind mounts, an sshd); run as root, e.g. in CI"
    missing = sorted({PACKAGES.get(name, name) for name in (*PACKAGES, "ip", "unshare", "nsenter")
                      if _which(name) is None})
    if missing:
        return f"a multi-host bed needs {', '.join(missing)} (Debian: apt-get install {' '.join(missing)})"
    return None


def ensure_packages():
    """Install pdsh and OpenSSH from the Debian packages when missing (as root, once per machine: other
    processes wait on a lock); the packages installed, none where they are present or where this is not root
    with apt-get. HostBedError when apt-get fails."""
    if all(_which(name) for name in PACKAGES) or os.geteuid() != 0 or _which("apt-get") is None:
        return []
    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = sorted({package for name, package in PACKAGES.items() if _which(name) is None})
        if not missing:
            return []
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            done = subprocess.run(install, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise HostBedError(f"`{' '.join(install)}` failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return missing


def _run(cmd, what, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise HostBedError(f"{what}: `{shlex.join(map(str, cmd))}` exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-1500:]}")
    return done.stdout


def _netns_pids(name):
    try:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [int(pid) for pid in out.split()]


def _kill(pids):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid):
    """Whether `pid` runs (a zombie, which only waits for its parent to collect its status, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _remove_namespaces(names, wait_s=10.0):
    """Kill every process in the network namespaces `names`, wait (up to `wait_s`) until none runs, delete them."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = [pid for name in names for pid in _netns_pids(name) if _alive(pid)]
        if not pids or time.monotonic() >= deadline:
            break
        _kill(pids)
        time.sleep(0.1)
    for name in names:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def _bed_namespaces(owner=None):
    """Namespaces of beds on this machine ({owner pid: [names]}), of `owner` only when given."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    beds = {}
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) == 4 and parts[0] == PREFIX and parts[1].isdigit():
            beds.setdefault(int(parts[1]), []).append(name)
    return beds if owner is None else {owner: beds.get(owner, [])}


def remove_abandoned_beds():
    """Remove the namespaces (and every process in them) of beds whose owner process is gone; how many beds."""
    abandoned = [names for owner, names in _bed_namespaces().items() if not Path(f"/proc/{owner}").exists()]
    for names in abandoned:
        _remove_namespaces(names)
    return len(abandoned)


@dataclasses.dataclass
class Host:
    """One host of the bed: its hostname, its address, its network namespace, and its sshd: the process that
    starts it (`sshd`) and the sshd itself, process 1 of the host's PID namespace (`sshd_pid`, as this
    machine numbers it)."""
    name: str
    address: str
    netns: str
    sshd: subprocess.Popen | None = None
    sshd_pid: int | None = None
    metadata_server: subprocess.Popen | None = None


_beds_started = 0


class HostBed:
    """`count` hosts named host0, host1, ... at 10.213.0.1, .2, ..., each with an sshd; a context manager.

    `hide` maps a host index to paths made empty on that host only (an empty directory mounted over each):
    a host whose environment lacks a package. `tpu`: the hosts are the workers of a TPU v4 slice of `count`
    hosts (`accelerator_type`). `dir` holds the bed's keys, configs and logs.
    """

    def __init__(self, count, dir, *, hide=None, tpu=False):
        global _beds_started
        _beds_started += 1
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._prefix = f"{PREFIX}-{os.getpid()}-{_beds_started}"
        self._switch = f"{self._prefix}-sw"
        self._hide = {int(index): [Path(p) for p in paths] for index, paths in (hide or {}).items()}
        self.hosts = [Host(f"host{i}", str(SUBNET[i + 1]), f"{self._prefix}-h{i}") for i in range(count)]
        self.tpu = tpu
        self.accelerator_type = f"v4-{2 * TPU_CHIPS_PER_HOST * count}" if tpu else None  # v4 names count TensorCores

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    # -- start ---------------------------------------------------------------------------------------------

    def start(self):
        """Make the hosts and start their sshds (about 2 s); HostBedError says which step failed. Removes the
        beds of owners that died first."""
        reason = unavailable()
        if reason:
            raise HostBedError(reason)
        remove_abandoned_beds()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
        self._keys()
        self._network()
        for index, host in enumerate(self.hosts):
            host.sshd = self._start_sshd(index, host)
        for host in self.hosts:
            self._wait_listening(host)
        if self.tpu:
            for index, host in enumerate(self.hosts):
                host.metadata_server = self._start_metadata_server(index, host)

    def _keys(self):
        for key in ("host_key", "client_key"):
            if not (self.dir / key).exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{PREFIX} {key}", "-f",
                      self.dir / key], "making the bed's ssh keys")
        (self.dir / "authorized_keys").write_text((self.dir / "client_key.pub").read_text())
        key_type, key = (self.dir / "host_key.pub").read_text().split()[:2]
        (self.dir / "known_hosts").write_text("".join(
            f"{host.name},{host.address} {key_type} {key}\n" for host in self.hosts))
        (self.dir / "ssh_config").write_text(
            "Host *\n"
            "  User root\n"
            f"  IdentityFile {self.dir / 'client_key'}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.dir / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 10\n"
            "  LogLevel ERROR\n")
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        ssh = bin_dir / "ssh"
        ssh.write_text(f"#!/bin/sh\nexec {_which('ssh')} -F {self.dir / 'ssh_config'} \"$@\"\n")
        ssh.chmod(0o755)
        hosts = "".join(f"{host.address}\t{host.name}\n" for host in self.hosts)
        metadata = f"{METADATA_ADDRESS}\tmetadata.google.internal\n" if self.tpu else ""
        (self.dir / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{hosts}{metadata}")
        if self.tpu:
            self._tpu_files()

    def _tpu_files(self):
        """Per host: a PCI sysfs tree with its TPU chips, and the files its metadata server answers."""
        host_bounds = (1, 1, len(self.hosts))
        endpoints = ",".join(f"t1v-n-bed-w-{i}:{1000 + i}:{host.address}" for i, host in enumerate(self.hosts))
        for index, host in enumerate(self.hosts):
            root = self.dir / "tpu" / host.name
            bus = root / "pci" / "devices"
            bus.mkdir(parents=True, exist_ok=True)
            for slot in range(TPU_CHIPS_PER_HOST):
                address = f"0000:00:{slot + 4:02x}.0"
                device = root / "pci-devices" / address
                device.mkdir(parents=True, exist_ok=True)
                (device / "vendor").write_text(_GOOGLE_PCI_VENDOR + "\n")
                (device / "device").write_text(_TPU_V4_PCI_DEVICE + "\n")
                if not (bus / address).is_symlink():
                    (bus / address).symlink_to(device)
            metadata = root / "metadata"
            metadata.mkdir(exist_ok=True)
            (metadata / "tpu-env").write_text(
                f"ACCELERATOR_TYPE: '{self.accelerator_type}'\nWORKER_ID: '{index}'\n"
                f"TPU_PROCESS_BOUNDS: '{','.join(map(str, host_bounds))}'\n"
                f"TPU_CHIPS_PER_PROCESS_BOUNDS: '{','.join(map(str, TPU_CHIPS_PER_HOST_BOUNDS))}'\n")
            (metadata / "worker-network-endpoints").write_text(endpoints)

    def _start_metadata_server(self, index, host):
        _run(["ip", "-n", host.netns, "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"],
             f"giving {host.name} its metadata address")
        log = self.dir / f"metadata.{host.name}.log"
        with open(log, "w") as out:
            server = subprocess.Popen(
                self.on_host(index, [sys.executable, "-I", METADATA_SERVER,
                                     self.dir / "tpu" / host.name / "metadata", METADATA_ADDRESS, 80], "/"),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + SSHD_START_S
        while time.monotonic() < deadline:  # listening once a connection to it is refused no more
            probe = subprocess.run(self.on_host(index, ["bash", "-c", f"exec 3<>/dev/tcp/{METADATA_ADDRESS}/80"],
                                                "/"), capture_output=True)
            if probe.returncode == 0:
                return server
            if server.poll() is not None:
                break
            time.sleep(0.1)
        raise HostBedError(f"{host.name}'s metadata server did not start: {log.read_text().strip()[-1500:]}")

    def _network(self):
        _run(["ip", "netns", "add", self._switch], "adding the bed's switch namespace")
        _run(["ip", "-n", self._switch, "link", "add", "br0", "type", "bridge"], "adding the bed's bridge")
        _run(["ip", "-n", self._switch, "link", "set", "br0", "up"], "starting the bed's bridge")
        for index, host in enumerate(self.hosts):
            port = f"p{index}"
            _run(["ip", "netns", "add", host.netns], f"adding {host.name}'s namespace")
            _run(["ip", "-n", self._switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
                  host.netns], f"wiring {host.name}")
            _run(["ip", "-n", self._switch, "link", "set", port, "master", "br0", "up"], f"wiring {host.name}")
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/{SUBNET.prefixlen}", "dev", "eth0"],
                 f"addressing {host.name}")
            for link in ("lo", "eth0"):
                _run(["ip", "-n", host.netns, "link", "set", link, "up"], f"starting {host.name}'s {link}")

    def _start_sshd(self, index, host):
        config = self.dir / f"sshd_config.{host.name}"
        config.write_text(
            f"ListenAddress {host.address}:22\n"
            f"HostKey {self.dir / 'host_key'}\n"
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
            f"PidFile {self.dir / f'sshd.{host.name}.pid'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PrintMotd no\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n")
        empty = self.dir / "empty"
        empty.mkdir(exist_ok=True)
        pci = [f"mount --bind {shlex.quote(str(self.dir / 'tpu' / host.name / 'pci' / 'devices'))} "
               "/sys/bus/pci/devices"] if self.tpu else []
        mounts = [f"mount --bind {shlex.quote(str(self.dir / 'hosts'))} /etc/hosts", *pci,
                  *(f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(path))}"
                    for path in self._hide.get(index, []))]
        script = " && ".join([*mounts, f"hostname {host.name}",
                              f"exec {_which('sshd')} -D -e -f {shlex.quote(str(config))}"])
        log = open(self.dir / f"sshd.{host.name}.log", "w")
        with log:
            return subprocess.Popen(["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount",
                                     "--propagation", "private", "--pid", "--fork", "--mount-proc", "sh", "-c",
                                     script],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def _wait_listening(self, host):
        log = self.dir / f"sshd.{host.name}.log"
        deadline = time.monotonic() + SSHD_START_S
        while time.monotonic() < deadline:
            if "Server listening" in log.read_text():
                children = Path(f"/proc/{host.sshd.pid}/task/{host.sshd.pid}/children").read_text().split()
                host.sshd_pid = int(children[0])  # unshare --fork's child: the sshd
                return
            if host.sshd.poll() is not None:
                break
            time.sleep(0.1)
        raise HostBedError(f"{host.name}'s sshd did not start listening on {host.address}:22 "
                           f"within {SSHD_START_S}s: {log.read_text().strip()[-1500:]}")

    # -- use -----------------------------------------------------------------------------------------------

    def hostfile(self, path, slots, order=None):
        """Write a DeepSpeed hostfile (`host0 slots=N` per line, hosts in `order`: indices, default all in
        order) to `path`; the path."""
        order = range(len(self.hosts)) if order is None else order
        Path(path).write_text("".join(f"{self.hosts[i].name} slots={slots}\n" for i in order))
        return Path(path)

    def on_host(self, index, cmd, workdir):
        """`cmd` (a list) as run on host `index` in `workdir`: in that host's network, UTS, mount and PID namespaces
        (those of its sshd), the caller's environment and user otherwise. nsenter stays as the command's parent
        (entering a PID namespace needs a fork) and passes its exit status on."""
        return ["nsenter", "--target", str(self.hosts[index].sshd_pid), "--net", "--uts", "--mount", "--pid",
                f"--wd={workdir}", "--", *map(str, cmd)]

    def client_env(self, env):
        """`env` with the bed's `ssh` first on PATH (what a user's ~/.ssh/config and keys do on a pod)."""
        env = dict(env)
        env["PATH"] = f"{self.dir / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        return env

    @staticmethod
    def _bed_pids(host):
        """The processes of the bed itself on `host`: its sshd, and its metadata server (nsenter and its child)."""
        pids = {host.sshd.pid, host.sshd_pid} if host.sshd is not None else set()
        if host.metadata_server is not None:
            pids.add(host.metadata_server.pid)
            with contextlib.suppress(OSError):
                pids.update(int(pid) for pid in Path(f"/proc/{host.metadata_server.pid}/task/"
                                                     f"{host.metadata_server.pid}/children").read_text().split())
        return pids

    def processes(self):
        """Every process on each host other than its sshd: {host name: [(pid, command line)]}."""
        found = {}
        for host in self.hosts:
            listed = []
            for pid in _netns_pids(host.netns):
                if pid in self._bed_pids(host):
                    continue
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                except OSError:
                    continue
                listed.append((pid, cmdline))
            found[host.name] = listed
        return found

    def settled_processes(self, wait_s=SETTLE_S):
        """`processes()` once every host is idle, or as they are after `wait_s` seconds: what a finished run left
        (an sshd ends a session's processes shortly after its client goes)."""
        deadline = time.monotonic() + wait_s
        while True:
            found = self.processes()
            if not any(found.values()) or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def left_behind(self, wait_s=SETTLE_S):
        """The hosts that still run processes once the bed has settled (`settled_processes`), with the command
        lines of those processes ({host name: [command line]}); empty when a run left nothing."""
        return {host: [cmdline for _, cmdline in listed] for host, listed in self.settled_processes(wait_s).items()
                if listed}

    # -- stop ----------------------------------------------------------------------------------------------

    def stop(self):
        """Kill every process on every host and the sshds, and delete the bed's namespaces (idempotent)."""
        _remove_namespaces([host.netns for host in self.hosts] + [self._switch])
        for host in self.hosts:
            for process in (host.metadata_server, host.sshd):
                if process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
