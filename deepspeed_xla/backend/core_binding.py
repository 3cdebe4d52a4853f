"""On PJRT CPU, each local rank runs on its own share of the host's cores.

PJRT CPU sizes its thread pools (XLA's intra-op pool, Eigen's for matrix products) by the cores
a process may run on, and PyTorch its intra-op pool by the host's. With one process per emulated
device, every rank of a host starts pools as large as the whole machine: two ranks on two cores run four
busy pools, and whenever both ranks execute a graph at once (data-parallel ranks do, in step) each
rank's threads wait for cores the other rank's threads hold, at every collective. DeepSpeed
offers the cure for its own CPU accelerator as an option (`deepspeed --bind_cores_to_rank`, which
starts each rank under numactl); for emulated XLA devices it is the default.

`bind_local_rank()` runs in each worker before the runtime starts its threads (backend.load): it
gives local rank r of L the r-th of L contiguous blocks of the cores the process may use (ranks
share a core when there are more ranks than cores), for every thread the process has, and the
threads started later inherit it; PyTorch's intra-op pool, sized when torch was imported, is
resized to the share unless OMP_NUM_THREADS chose its size. Two ranks on two cores training a
4.2M-parameter MLP, bound against unbound over four runs each: DeepSpeed ZeRO-3 117-122 against
127-130 ms per step, a hand-written loop 84-88 against 87-91 (benchmarks/HISTORY.md, step_overhead).

Left alone: a process that is not one of several local ranks (a local size of at least 2 in
LOCAL_WORLD_SIZE or LOCAL_SIZE, and a LOCAL_RANK below it), a device other than PJRT CPU, a process
whose cores were already narrowed by whoever started it (numactl, taskset, `--bind_cores_to_rank`:
its cores differ from its parent's), a child of a bound rank (it inherits the rank's share), and
DS_XLA_BIND_CORES=none.
"""

import os
import sys

from xla_host import discovery

SETTING = "DS_XLA_BIND_CORES"  # "rank" (default): each local rank its share; "none": the cores as inherited
BOUND = "DS_XLA_CORES_BOUND"  # set in a bound worker to "local_rank/local_size": its children keep the share


def share(local_rank, local_size, cores):
    """Local rank `local_rank`'s block of `cores` (any iterable of core ids) when `local_size` ranks
    split them: contiguous, in core order, as even as the count allows; with fewer cores than ranks,
    one core shared by neighbouring ranks. A sorted list."""
    cores = sorted(cores)
    start = local_rank * len(cores) // local_size
    end = max((local_rank + 1) * len(cores) // local_size, start + 1)
    return cores[start:end]


def _narrowed_by_parent(cores):
    # A launcher that binds ranks itself (numactl/taskset exec the worker) leaves it fewer cores than its parent has.
    try:
        return cores != os.sched_getaffinity(os.getppid())
    except OSError:  # the parent has exited: nothing to compare with
        return False


def bind_local_rank(environ=os.environ):
    """Bind every thread of this process to its local rank's share of the cores (module docstring), and size
    PyTorch's intra-op pool to the share unless OMP_NUM_THREADS sets it. Returns the cores bound to, a sorted
    list, or None where the process is left alone. ValueError for a DS_XLA_BIND_CORES other than "rank" or
    "none", or a LOCAL_RANK, LOCAL_WORLD_SIZE or LOCAL_SIZE that is not an integer."""
    choice = environ.get(SETTING) or "rank"  # set but empty: the default
    if choice not in ("rank", "none"):
        raise ValueError(f"{SETTING}={choice!r} is not one of 'rank' (each local rank of PJRT CPU runs on its own "
                         "share of the host's cores) or 'none' (the cores the process was started with)")
    if choice == "none" or not hasattr(os, "sched_setaffinity") or discovery.device_type(environ) != "CPU":
        return None
    local_rank = _integer(environ, "LOCAL_RANK")
    local_size = _integer(environ, "LOCAL_WORLD_SIZE" if environ.get("LOCAL_WORLD_SIZE") else "LOCAL_SIZE")
    # LOCAL_RANK=-1 is the usual "not launched"; a rank outside its size has no share to take.
    if local_rank is None or local_size is None or local_size < 2 or not 0 <= local_rank < local_size:
        return None
    marker = f"{local_rank}/{local_size}"
    cores = os.sched_getaffinity(0)
    if environ.get(BOUND) == marker or _narrowed_by_parent(cores):
        return None
    mine = share(local_rank, local_size, cores)
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), mine)
        except OSError:  # a thread that ended meanwhile
            pass
    environ[BOUND] = marker
    # PyTorch sized its OpenMP pool when it was imported, before this; a size the user chose stays.
    torch = sys.modules.get("torch")
    if torch is not None and not environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(len(mine))
    return mine


def _integer(environ, name):
    """`environ[name]` as an int, None where unset or empty; ValueError naming the variable otherwise."""
    value = environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer (the launcher sets it to this process's local rank "
                         "or local process count)") from None
