"""The environment fingerprint of a run, built from an allowlist.

Nothing here imports torch, torch_xla or DeepSpeed, or starts a device runtime: versions
come from installed package metadata and devices from tpu-info's device API or the PCI bus, because on
a TPU host the process that starts the runtime owns the chips the checks need.
"""

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from harness.candidate.candidates import MATMUL_PRECISION_ENV
from harness.paths import REPO

# Variables that change what a run means; nothing else from the environment is recorded.
ENV_ALLOWLIST = ("PJRT_DEVICE", "DS_ACCELERATOR", "XLA_FLAGS", "CPU_NUM_DEVICES", "TPU_ACCELERATOR_TYPE",
                 "TPU_VISIBLE_CHIPS")


def installed_version(distribution):
    """The installed version string of `distribution` from its package metadata (nothing is imported), or None if absent."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def git_revision(path):
    """The checkout's HEAD commit (+dirty with uncommitted changes), or None outside git."""
    try:
        rev = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def source_revision(distribution):
    """Git revision of a distribution installed from a VCS URL or a local checkout, else None."""
    try:
        text = metadata.distribution(distribution).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    info = json.loads(text)
    if "vcs_info" in info:
        return info["vcs_info"].get("commit_id")
    url = info.get("url", "")
    if url.startswith("file://"):
        return git_revision(url[len("file://"):])
    return None


def devices(backend):
    """(device_kind, device_count) without starting any device runtime."""
    if backend == "cpu":
        # PJRT CPU: each check process owns CPU_NUM_DEVICES emulated devices (1 unless set).
        return "PJRT CPU", int(os.environ.get("CPU_NUM_DEVICES", "1"))
    try:  # tpu-info's device API reads the PCI bus (no runtime), and knows every chip kind
        from tpu_info import device as tpu_device
        kind, count = tpu_device.get_local_chips()
        if count:
            return str(kind), count
    except (ImportError, OSError, AssertionError):
        pass
    from xla_host.tpu_topology import count_tpu_chips  # PCI sysfs probe, no torch_xla import
    return os.environ.get("TPU_ACCELERATOR_TYPE", "TPU"), count_tpu_chips()


def tpu_slice():
    """{tpu_topology, tpu_hosts} of this TPU VM's slice (metadata server or TPU_* variables), for the report."""
    from xla_host.tpu_topology import detect_topology
    try:
        topology = detect_topology()
    except RuntimeError as err:
        return {"tpu_topology": f"unknown ({err})", "tpu_hosts": None}
    if topology is None:
        return {}
    return {"tpu_topology": topology.accelerator_type, "tpu_hosts": len(topology.worker_ips)}


_TRANSPORTS = {"bridge": "host bridge (gloo between host copies)", "native": "XLA-native collectives"}


def collective_transport(candidate_text, backend, env):
    """How deepspeed_xla's ranks exchange tensors in this run (its DS_XLA_COMM_TRANSPORT, else by
    device: the host bridge on PJRT CPU, native on TPU); other candidates bring their own."""
    if candidate_text != "deepspeed_xla":
        return "the candidate's own"
    chosen = env.get("DS_XLA_COMM_TRANSPORT", "").strip().lower() or ("bridge" if backend == "cpu" else "native")
    return _TRANSPORTS.get(chosen, chosen)


def fingerprint(backend, candidate_text, device_kind, device_count, env):
    """The fingerprint; `env` is the environment the checks ran with."""
    libtpu = installed_version("libtpu") or installed_version("libtpu-nightly")
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": f"{platform.system()} {platform.machine()}",
        "host_cpus": os.cpu_count(),
        "torch": installed_version("torch"),
        "torch_xla": installed_version("torch_xla"),
        "libtpu": libtpu,
        "deepspeed": installed_version("deepspeed"),
        "deepspeed_git": source_revision("deepspeed"),
        "backend": backend,
        "device_kind": device_kind,
        "device_count": device_count,
        "candidate": candidate_text,
        "collective_transport": collective_transport(candidate_text, backend, env),
        # PJRT CPU multiplies fp32 in fp32 whatever the setting; TPUs use bf16 passes unless told otherwise
        "matmul_precision": env.get(MATMUL_PRECISION_ENV) or "torch_xla default",
        "harness_revision": git_revision(REPO),
        "env": {name: env[name] for name in ENV_ALLOWLIST if name in env},
    }


EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"
STALE_LOCK_AGE_S = 60


def use_stack_extensions(environ=os.environ):
    """Point TORCH_EXTENSIONS_DIR at the ops scripts/xla_stack.py prebuilt in this environment
    (sys.prefix/torch_extensions), unless it is set or there is none; the directory in use.

    DeepSpeed JIT-builds its C++ ops into ~/.cache/torch_extensions by default, shared by every
    environment on the machine: two environments rebuild the same op alternately, and a build
    killed midway leaves a lock that makes every later load wait forever. With the prebuilt ops in
    use, the environment's bin also goes first on PATH (the ninja that built them).
    """
    prebuilt = Path(sys.prefix) / "torch_extensions"
    if EXTENSIONS_ENV not in environ and prebuilt.is_dir():
        environ[EXTENSIONS_ENV] = str(prebuilt)
    chosen = Path(environ.get(EXTENSIONS_ENV) or Path.home() / ".cache" / "torch_extensions")
    if chosen == prebuilt:
        _stack_bin_first(environ)
    return chosen


def _stack_bin_first(environ):
    """Put this environment's bin first on PATH. torch builds and checks ops with the first `ninja` on
    PATH; the stack's ninja built the prebuilt ops, and another version (a system ninja) cannot read
    its build log, so it would rebuild every op on every load."""
    stack_bin = str(Path(sys.prefix) / "bin")
    rest = [entry for entry in environ.get("PATH", "").split(os.pathsep) if entry and entry != stack_bin]
    environ["PATH"] = os.pathsep.join([stack_bin, *rest])


def _age(path, now=None):
    try:
        return (now or time.time()) - path.stat().st_mtime
    except OSError:  # released (deleted) since it was listed
        return 0.0


def stale_build_locks(root, now=None):
    """Build locks under `root` (torch's FileBaton `lock` files) that no build holds any more.

    torch creates `<op build dir>/lock` for the length of a build and every later load of the
    op waits until it disappears; its owner is not recorded. A lock is stale when it is older
    than STALE_LOCK_AGE_S and no process works in that build directory (ninja and the compiler
    run there for the whole build).
    """
    if not root or not Path(root).is_dir():
        return []
    locks = [lock for lock in Path(root).glob("**/lock") if _age(lock, now) > STALE_LOCK_AGE_S]
    if not locks:
        return []
    import psutil
    busy = set()
    for process in psutil.process_iter():
        try:
            busy.add(Path(process.cwd()))
        except psutil.Error:
            continue
    return [lock for lock in locks if not any(cwd == lock.parent or lock.parent in cwd.parents for cwd in busy)]


def lock_note(root):
    """What a check stuck until its timeout may have waited for: the build locks under root, or ''."""
    locks = sorted(Path(root).glob("**/lock")) if Path(root).is_dir() else []
    if not locks:
        return ""
    stale = set(stale_build_locks(root))
    return "; build locks present: " + ", ".join(
        f"{lock} ({'stale: no process is building there' if lock in stale else 'a build in progress'})"
        for lock in locks)


def stale_lock_line(locks):
    """One line naming stale build locks and what to do, or None."""
    if not locks:
        return None
    return (f"stale build lock{'s' if len(locks) > 1 else ''} {', '.join(map(str, locks))}: no process is building "
            "there (a build was killed midway), and every load of that op would wait for it forever; delete it and "
            "run again")
