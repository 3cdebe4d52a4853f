"""The environment fingerprint of a run, built from an allowlist.

Nothing here imports torch, torch_xla or DeepSpeed, or starts a device runtime: versions
come from installed package metadata and devices from tpu-info or the PCI bus, because on
a TPU host the process that starts the runtime owns the chips the checks need.
"""

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Variables that change what a run means; nothing else from the environment is recorded.
ENV_ALLOWLIST = ("PJRT_DEVICE", "DS_ACCELERATOR", "XLA_FLAGS", "CPU_NUM_DEVICES", "TPU_ACCELERATOR_TYPE",
                 "TPU_VISIBLE_CHIPS")


def installed_version(distribution):
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


def parse_tpu_info(text):
    """(chip count, chip kind) from `tpu-info` output: one table row per /dev chip."""
    rows = [line for line in text.splitlines() if "/dev/" in line]
    kinds = []
    for row in rows:
        cells = [cell.strip() for cell in row.replace("│", "|").split("|") if cell.strip()]
        if len(cells) > 1:
            kinds.append(cells[1])
    return len(rows), (kinds[0] if kinds else None)


def devices(backend):
    """(device_kind, device_count) without starting any device runtime."""
    if backend == "cpu":
        # PJRT CPU: each check process owns CPU_NUM_DEVICES emulated devices (1 unless set).
        return "PJRT CPU", int(os.environ.get("CPU_NUM_DEVICES", "1"))
    if shutil.which("tpu-info"):
        try:
            out = subprocess.run(["tpu-info"], capture_output=True, text=True, timeout=60).stdout
            count, kind = parse_tpu_info(out)
            if count:
                return kind or "TPU", count
        except (OSError, subprocess.SubprocessError):
            pass
    from deepspeed_xla.tpu_topology import count_tpu_chips  # PCI sysfs probe, no torch_xla import
    return os.environ.get("TPU_ACCELERATOR_TYPE", "TPU"), count_tpu_chips()


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
        "harness_revision": git_revision(REPO),
        "env": {name: env[name] for name in ENV_ALLOWLIST if name in env},
    }
