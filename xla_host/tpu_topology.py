"""A TPU VM host's slice as Cloud TPU describes it, its chips on the PCI bus, and who holds them.

`detect_topology` reads the slice from the GCE metadata server (or the TPU_* variables on
GKE), `count_tpu_chips` counts chips on PCI sysfs the way torch_xla does, and `chip_holders_line`
names the processes that hold chips open (/proc). Nothing here imports torch_xla: a process
that starts the XLA runtime claims the chips, and the launcher parent, the harness's
environment report and the preflight must leave them to the workers.
"""

from __future__ import annotations

import math
import os
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping


PCI_DEVICES = "/sys/bus/pci/devices"
_GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids torch_xla counts as TPU chips (torch_xla._internal.tpu.num_available_chips).
_TPU_PCI_DEVICES = frozenset({
    "0x0027",  # v2, v3
    "0x005e",  # v4
    "0x0063",  # v5e
    "0x006f",  # v6e
    "0x0076",  # 7x
    "0x0056",  # counted by torch_xla, which labels it "testing only"
    "0x0062",  # counted by torch_xla, which labels it "testing only"
})

_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
# With TPU_SKIP_MDS_QUERY set (GKE), torch_xla reads each tpu-env field from the first of
# these environment variables that is set.
_ENV_SOURCES = {
    "ACCELERATOR_TYPE": ("TPU_ACCELERATOR_TYPE",),
    "TPU_PROCESS_BOUNDS": ("TPU_PROCESS_BOUNDS", "TPU_HOST_BOUNDS"),
    "TPU_CHIPS_PER_PROCESS_BOUNDS": ("TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS"),
    "WORKER_ID": ("CLOUD_TPU_TASK_ID", "TPU_WORKER_ID"),
}

# TPU v2/v3 metadata carries no bounds. torch_xla instead assumes 2x2 chips (8 cores) per
# host and looks the host grid up by slice size; keyed here by number of hosts.
_V2_V3_CHIPS_PER_HOST = (2, 2, 1)
_V2_V3_CORES_PER_HOST = 8
_V2_V3_HOST_GRIDS = {
    1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1), 16: (4, 4, 1),
    32: (4, 8, 1), 64: (8, 8, 1), 128: (8, 16, 1), 256: (16, 16, 1),
}

_ACCELERATOR_TYPE = re.compile(r"^(?:v|tpu)(\d+)[a-z]*-(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class TpuTopology:
    """One TPU VM host's view of its slice, in the terms of Cloud TPU metadata.

    TPU metadata describes one process per *host*: its TPU_PROCESS_BOUNDS is the grid of
    hosts (`host_bounds`) and its TPU_CHIPS_PER_PROCESS_BOUNDS the grid of chips on each
    host (`chips_per_host_bounds`). `worker_env` turns that into one process per chip.
    """

    accelerator_type: str  # e.g. "v4-16", "v5litepod-8", "tpu7x-8"
    host_bounds: tuple[int, int, int]
    chips_per_host_bounds: tuple[int, int, int]
    worker_id: int  # this host's index in worker_ips
    worker_ips: tuple[str, ...]  # every host of the slice, ordered by worker id

    def __post_init__(self):
        # Accept lists from callers, but keep the instance hashable and comparable.
        for name in ("host_bounds", "chips_per_host_bounds", "worker_ips"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not _ACCELERATOR_TYPE.match(self.accelerator_type):
            raise ValueError(f"Accelerator type {self.accelerator_type!r} is not of the "
                             f"form 'v4-8' or 'tpu7x-8', so its TPU version is unknown.")
        for name in ("host_bounds", "chips_per_host_bounds"):
            bounds = getattr(self, name)
            if len(bounds) != 3 or not all(isinstance(d, int) and d > 0 for d in bounds):
                raise ValueError(f"{name} must be three positive integers, got {bounds!r}.")
        if len(self.worker_ips) != self.num_hosts:
            raise ValueError(f"worker_ips lists {len(self.worker_ips)} hosts but host_bounds "
                             f"{self.host_bounds} describe {self.num_hosts}.")
        if not 0 <= self.worker_id < self.num_hosts:
            raise ValueError(f"worker_id {self.worker_id} is outside the slice's "
                             f"{self.num_hosts} hosts (0..{self.num_hosts - 1}).")

    @property
    def version(self) -> int:
        """TPU generation: 4 for 'v4-8', 5 for 'v5litepod-8', 7 for 'tpu7x-8'."""
        return int(_ACCELERATOR_TYPE.match(self.accelerator_type).group(1))

    @property
    def num_hosts(self) -> int:
        """Hosts (TPU VMs) in the slice: the product of host_bounds (TPU_PROCESS_BOUNDS), e.g. 2 for 'v4-16'."""
        return math.prod(self.host_bounds)

    @property
    def chips_per_host(self) -> int:
        """TPU chips on each host: the product of chips_per_host_bounds (TPU_CHIPS_PER_PROCESS_BOUNDS), e.g. 4 (2x2x1) on v4."""
        return math.prod(self.chips_per_host_bounds)


def count_tpu_chips(sysfs_root: str | os.PathLike = PCI_DEVICES) -> int:
    """Number of TPU chips on PCI, counted as torch_xla does; 0 where there is no such bus."""
    count = 0
    for vendor in Path(sysfs_root).glob("*/vendor"):
        if vendor.read_text().strip() != _GOOGLE_PCI_VENDOR:
            continue
        if (vendor.parent / "device").read_text().strip() in _TPU_PCI_DEVICES:
            count += 1
    return count


_CHIP_DEVICE = re.compile(r"/dev/(?:accel|vfio/)\d+")


def chip_owners(proc_root: str | os.PathLike = "/proc") -> dict[str, list[int]]:
    """{TPU device file: PIDs that hold it open} (/dev/accelN on v2-v4, /dev/vfio/N from v5e),
    read from /proc/<pid>/fd without touching the chips; empty where nothing holds one."""
    owners: dict[str, list[int]] = {}
    try:
        pids = [entry.name for entry in os.scandir(proc_root) if entry.name.isdigit()]
    except OSError:
        return owners
    for pid in pids:
        try:  # a process may exit, or not be ours to read, at any point of the scan
            fds = [entry.path for entry in os.scandir(os.path.join(proc_root, pid, "fd"))]
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if _CHIP_DEVICE.fullmatch(target) and int(pid) not in owners.setdefault(target, []):
                owners[target].append(int(pid))
    return owners


def chip_holders_line(proc_root: str | os.PathLike = "/proc", own_pid: int | None = None) -> str | None:
    """One line naming the processes other than `own_pid` (default: this one) that hold TPU chips
    open, and the chips; None when no other process holds one."""
    own_pid = os.getpid() if own_pid is None else own_pid
    held = {device: [pid for pid in pids if pid != own_pid] for device, pids in chip_owners(proc_root).items()}
    held = {device: pids for device, pids in held.items() if pids}
    if not held:
        return None
    pids = sorted({pid for pids in held.values() for pid in pids})
    many = len(pids) > 1
    return (f"the TPU chips are held by process{'es' if many else ''} {', '.join(map(str, pids))} "
            f"({', '.join(sorted(held))}); stop {'them' if many else 'it'} first: the process that opens the chips "
            "owns them")


def detect_topology(environ: Mapping[str, str] | None = None, *,
                    sysfs_root: str | os.PathLike = PCI_DEVICES,
                    timeout: float = 2.0) -> TpuTopology | None:
    """This host's TpuTopology, or None when it has no TPU chips.

    Chips are looked for first, so a machine without TPUs never waits on the metadata
    server. As in torch_xla, the topology comes from the GCE metadata server (`tpu-env`
    and `worker-network-endpoints`) unless TPU_SKIP_MDS_QUERY is set, in which case
    it comes from the TPU_* variables in `environ` (default: os.environ), as on GKE.
    A host that has chips but no readable topology raises RuntimeError.
    """
    if count_tpu_chips(sysfs_root) == 0:
        return None
    environ = os.environ if environ is None else environ
    # torch_xla treats any non-empty value, even "0", as set.
    from_env = bool(environ.get("TPU_SKIP_MDS_QUERY"))
    if from_env:
        tpu_env = {key: next((environ[name] for name in names if name in environ), None)
                   for key, names in _ENV_SOURCES.items()}
        worker_ips = [host for host in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]
    else:
        try:
            import yaml  # only here: discovery without metadata needs nothing beyond the standard library
            tpu_env = yaml.safe_load(_metadata("tpu-env", timeout))
            endpoints = _metadata("worker-network-endpoints", timeout)
        except OSError as error:
            raise RuntimeError(f"This host has TPU chips but its TPU metadata could not "
                               f"be read ({error}).") from error
        # Each endpoint reads "hostname:uid:ip".
        worker_ips = [endpoint.split(":")[2] for endpoint in endpoints.split(",")]

    def field(key: str) -> str:
        value = tpu_env.get(key)
        if value in (None, ""):
            where = (" or ".join(_ENV_SOURCES[key]) + " in the environment" if from_env
                     else key + " in the TPU metadata tpu-env")
            raise RuntimeError(f"This host has TPU chips but no {where}.")
        return str(value)

    def bounds(key: str) -> tuple[int, ...]:
        return tuple(int(d) for d in field(key).split(","))

    accelerator_type = field("ACCELERATOR_TYPE")
    match = _ACCELERATOR_TYPE.match(accelerator_type)
    if match and int(match.group(1)) <= 3:
        hosts = int(match.group(2)) // _V2_V3_CORES_PER_HOST
        if hosts not in _V2_V3_HOST_GRIDS:
            raise RuntimeError(f"No host layout is known for a {accelerator_type} slice.")
        host_bounds = _V2_V3_HOST_GRIDS[hosts]
        chips_per_host_bounds = _V2_V3_CHIPS_PER_HOST
    else:
        host_bounds = bounds("TPU_PROCESS_BOUNDS")
        chips_per_host_bounds = bounds("TPU_CHIPS_PER_PROCESS_BOUNDS")
    return TpuTopology(
        accelerator_type=accelerator_type,
        host_bounds=host_bounds,
        chips_per_host_bounds=chips_per_host_bounds,
        worker_id=int(field("WORKER_ID")),
        # A one-host slice may list no hostnames at all (torch_xla then uses localhost).
        worker_ips=worker_ips or ["localhost"],
    )


def _metadata(key: str, timeout: float) -> str:
    request = urllib.request.Request(_METADATA_URL + key, headers={"Metadata-Flavor": "Google"})
    # The metadata server is link-local: an HTTP proxy from the environment cannot reach it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout) as response:
        return response.read().decode()
