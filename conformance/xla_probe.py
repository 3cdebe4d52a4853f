"""Everything the conformance suite asks torch_xla about its own state, in one place: this is the
only file that knows torch_xla's private API (torch_xla._XLAC), so a torch_xla release that
moves it, or a second XLA runtime, changes this file and no check.

Probes observe; they never change what a candidate does (a sync runs pending work, as any
device-to-host copy would).
"""

import glob
import os

import torch_xla
import torch_xla.debug.metrics as metrics

# Run as a fresh process's code (run_fresh) to read the runtime state there.
RUNTIME_STARTED_SOURCE = "import torch_xla\nruntime_started = torch_xla._XLAC._xla_runtime_is_initialized\n"


def runtime_started():
    """True once this process has created its PJRT client (and owns its devices)."""
    return torch_xla._XLAC._xla_runtime_is_initialized()


def sync():
    """Run every pending graph and wait for it, so live XLA tensors hold device buffers."""
    torch_xla.sync(wait=True)


def pending_ops(tensor):
    """IR operations still to run behind `tensor` (beyond its materialised data)."""
    text = torch_xla._XLAC._get_xla_tensors_text([tensor])
    return [line.split("=", 1)[1].split("(")[0].strip() for line in text.splitlines()
            if "=" in line and "xla::device_data" not in line]


def hlo(tensors):
    """The HLO module text that would compute `tensors` (traced, not run)."""
    return torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))


def reset_collective_chain(device):
    """Start a new chain of traced collectives on `device`: torch_xla orders collectives through a
    per-device token, and traces of worlds larger than this one must not reach a later execution."""
    torch_xla._XLAC._set_all_reduce_token(str(device), None)


def _metric_count(name):
    data = metrics.metric_data(name)
    return data[0] if data else 0


def graph_counters():
    """Cumulative counts in this process: XLA graphs compiled, graph executions, device-to-host transfers."""
    return {"compilations": _metric_count("CompileTime"), "executions": _metric_count("ExecuteTime"),
            "transfers": _metric_count("TransferFromDeviceTime")}


def graph_dump_env(path):
    """Environment for a fresh process whose torch_xla appends the HLO of every graph it executes to
    `path` (with the device ordinal as suffix); torch_xla reads it once, before its first graph."""
    return {"XLA_SAVE_TENSORS_FILE": str(path), "XLA_SAVE_TENSORS_FMT": "hlo"}


def graph_dump_size(path):
    """Bytes written so far to the dump that graph_dump_env(path) asked for (0 before the first graph)."""
    dumps = glob.glob(f"{path}*")
    return os.path.getsize(dumps[0]) if dumps else 0


def matmuls_in_graph_dump(path, start, end):
    """HLO dot operations in the graphs dumped between byte offsets `start` and `end` of that dump."""
    dumps = glob.glob(f"{path}*")
    if not dumps:
        return 0
    with open(dumps[0], "rb") as f:
        f.seek(start)
        return f.read(end - start).decode(errors="replace").count(" dot(")
