"""The per-process PJRT/TPU environment that PyTorch/XLA's own spawn would set, computed in the launcher.

When PyTorch/XLA starts one process per chip (`xmp.spawn`), each child calls
`torch_xla._internal.pjrt.initialize_multiprocess`, which writes a few variables into its
own `os.environ` (`tpu.configure_topology`) just before the runtime starts, so that every
process drives exactly one chip. DeepSpeed's launcher starts the workers itself, so each
worker applies those same variables (`apply_tpu_worker_env`) at interpreter start, before
torch_xla is imported, from the host's topology (xla_host.tpu_topology) and its
LOCAL_RANK/LOCAL_SIZE. It overrides the TPU_VISIBLE_CHIPS=0,1,.. that the launcher sets for all
local ranks alike. Nothing here imports torch_xla.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from xla_host.tpu_topology import TpuTopology, detect_topology

# Set in a worker once its TPU topology is applied: "local_rank/local_size".
TPU_ENV_APPLIED = "DS_XLA_TPU_WORKER_ENV"


def worker_env(topology: TpuTopology, local_rank: int, local_world_size: int,
               base_port: int = 8476) -> dict[str, str]:
    """The variables PyTorch/XLA's spawn would set for local process `local_rank` of this host.

    With one process per chip (`local_world_size == topology.chips_per_host`) this is
    what `pjrt.initialize_multiprocess` sets through `tpu.configure_topology`: each
    process sees only chip `local_rank`, the slice becomes a grid of one-chip processes,
    and every process listens on `base_port + local_rank` of its host.

    A single process on a single-host slice gets what `xmp.spawn(nprocs=1)` sets through
    `tpu.configure_one_chip_topology`: chip 0 alone. Other process counts are refused,
    because torch_xla has no layout for a process per some, but not all, chips.
    """
    chips = topology.chips_per_host
    if local_world_size < 1 or local_world_size > chips:
        raise ValueError(f"local_world_size={local_world_size} must be between 1 and the "
                         f"{chips} TPU chips of a {topology.accelerator_type} host.")
    single_process = local_world_size == 1 and chips > 1
    if local_world_size != chips and not (single_process and topology.num_hosts == 1):
        raise ValueError(f"local_world_size={local_world_size} must be {chips}, one process "
                         f"per chip of a {topology.accelerator_type} host (or 1 on a "
                         f"single-host slice).")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} must be in 0..{local_world_size - 1} "
                         f"for local_world_size={local_world_size}.")
    if not 0 < base_port <= 65536 - local_world_size:
        raise ValueError(f"base_port={base_port} leaves no room for {local_world_size} "
                         f"consecutive TCP ports below 65536.")

    if single_process:
        return {
            "PJRT_LOCAL_PROCESS_COUNT": "1",
            "TPU_VISIBLE_CHIPS": "0",
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": "1,1,1",
        }

    # One process per chip: the grid of hosts times the grid of chips on each host.
    process_bounds = ",".join(
        str(h * c) for h, c in zip(topology.host_bounds, topology.chips_per_host_bounds))
    if topology.version == 7:
        process_bounds += ",2"  # torch_xla adds a fourth bound on v7 only
    # torch_xla addresses a one-host slice as localhost, whatever the metadata lists.
    hosts = topology.worker_ips if topology.num_hosts > 1 else ("localhost",)
    ports = range(base_port, base_port + local_world_size)
    return {
        "PJRT_LOCAL_PROCESS_RANK": str(local_rank),
        "PJRT_LOCAL_PROCESS_COUNT": str(local_world_size),
        "TPU_VISIBLE_CHIPS": str(local_rank),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": process_bounds,
        # Assumes, like torch_xla, the same number of processes on every host.
        "CLOUD_TPU_TASK_ID": str(topology.worker_id * local_world_size + local_rank),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{host}:{port}" for host in hosts for port in ports),
        "TPU_PROCESS_PORT": str(ports[local_rank]),
    }


def apply_tpu_worker_env(environ: MutableMapping[str, str] | None = None, *, topology=None,
                         sysfs_root: str | None = None) -> dict[str, str] | None:
    """On a TPU host, give this launcher-started worker its one-chip topology; returns what was set.

    Does nothing (returns None) outside a launcher worker (no LOCAL_RANK and LOCAL_SIZE /
    LOCAL_WORLD_SIZE), when PJRT_DEVICE names another device kind, on a host without TPU
    chips, or when this process already has its worker env (children inherit it).
    Must run before the XLA runtime starts; it reads no torch_xla. `topology` (a
    xla_host.tpu_topology.TpuTopology) replaces detection, for tests.
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
    if topology is None:
        kwargs = {} if sysfs_root is None else {"sysfs_root": sysfs_root}
        topology = detect_topology(environ, **kwargs)
        if topology is None:
            return None
    try:
        values = worker_env(topology, int(local_rank), int(local_size))
    except ValueError as error:
        raise RuntimeError(
            f"deepspeed_xla: rank with LOCAL_RANK={local_rank} of {local_size} local processes cannot be given "
            f"a TPU topology: {error} Start one process per chip (`deepspeed --num_gpus "
            f"{topology.chips_per_host}`, or no --num_gpus) or a single process.") from None
    environ.update(values)
    environ[TPU_ENV_APPLIED] = marker
    return values
