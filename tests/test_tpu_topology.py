"""xla_host.tpu_topology and deepspeed_xla.backend.pjrt_env against PyTorch/XLA's own per-process TPU setup.

No TPU is needed: torch_xla is fed simulated TPU metadata through
`torch_xla._internal.tpu._get_metadata`, the one function through which its
`get_tpu_env`, `version` and `get_worker_ips` reach the metadata server, so all three
run unmodified. Its spawn-time setup (`pjrt.initialize_multiprocess` /
`initialize_singleprocess`) then runs for real, minus the device calls that would start
the runtime, and whatever it wrote to os.environ is compared with `worker_env`.
"""

import http.server
import importlib.util
import os
import subprocess
import sys
import threading
import urllib.error
from dataclasses import dataclass
from pathlib import Path

import pytest

from deepspeed_xla.backend.pjrt_env import worker_env
from harness import metadata_server
from xla_host import tpu_topology
from xla_host.tpu_topology import TpuTopology, count_tpu_chips, detect_topology

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Slice:
    accelerator_type: str
    host_bounds: tuple
    chips_per_host_bounds: tuple

    @property
    def num_hosts(self):
        return self.host_bounds[0] * self.host_bounds[1] * self.host_bounds[2]

    @property
    def chips_per_host(self):
        x, y, z = self.chips_per_host_bounds
        return x * y * z

    @property
    def worker_ips(self):
        return tuple(f"10.164.0.{10 + host}" for host in range(self.num_hosts))

    def topology(self, host):
        return TpuTopology(self.accelerator_type, self.host_bounds, self.chips_per_host_bounds,
                           worker_id=host, worker_ips=self.worker_ips)

    def metadata(self, host):
        """What the GCE metadata server would answer on `host`, keyed like its URLs."""
        tpu_env = {"ACCELERATOR_TYPE": self.accelerator_type, "WORKER_ID": str(host)}
        if not self.accelerator_type.startswith(("v2-", "v3-")):  # v2/v3 metadata has no bounds
            tpu_env["TPU_PROCESS_BOUNDS"] = ",".join(map(str, self.host_bounds))
            tpu_env["TPU_CHIPS_PER_PROCESS_BOUNDS"] = ",".join(map(str, self.chips_per_host_bounds))
        return {
            "tpu-env": "".join(f"{key}: '{value}'\n" for key, value in tpu_env.items()),
            "worker-network-endpoints": ",".join(
                f"t1v-n-w-{i}:{1000 + i}:{ip}" for i, ip in enumerate(self.worker_ips)),
        }


SLICES = {
    "v4-8": Slice("v4-8", (1, 1, 1), (2, 2, 1)),
    "v5e-8": Slice("v5litepod-8", (1, 1, 1), (2, 4, 1)),
    "v5p-8": Slice("v5p-8", (1, 1, 1), (2, 2, 1)),
    "v4-16": Slice("v4-16", (1, 1, 2), (2, 2, 1)),
    # The branches torch_xla treats specially: v2/v3 bounds from a table, v7's fourth bound.
    "v3-32": Slice("v3-32", (2, 2, 1), (2, 2, 1)),
    "tpu7x-8": Slice("tpu7x-8", (1, 1, 1), (2, 2, 1)),
}
HOSTS = [pytest.param(name, host, id=f"{name}-host{host}")
         for name, s in SLICES.items() for host in range(s.num_hosts)]
RANKS = [pytest.param(name, host, rank, id=f"{name}-host{host}-rank{rank}")
         for name, s in SLICES.items() for host in range(s.num_hosts)
         for rank in range(s.chips_per_host)]
SINGLE_HOST = [name for name, s in SLICES.items() if s.num_hosts == 1]


def _is_topology_var(name):
    return name.startswith(("TPU_", "PJRT_", "CLOUD_TPU_")) or name in ("ACCELERATOR_TYPE", "WORKER_ID")


@pytest.fixture
def bare_environ(monkeypatch):
    """os.environ without TPU settings; afterwards also drops what torch_xla set in it."""
    for name in [n for n in os.environ if _is_topology_var(n)]:
        monkeypatch.delenv(name)
    yield
    for name in [n for n in os.environ if _is_topology_var(n)]:
        del os.environ[name]  # monkeypatch then restores the caller's own values


@pytest.fixture
def torch_xla_spawn_env(bare_environ, monkeypatch):
    """Runs torch_xla's per-child setup on simulated metadata; returns the variables it set."""
    import torch_xla
    from torch_xla._internal import pjrt, tpu

    # Stub only what would pick devices and so start the runtime.
    monkeypatch.setattr(pjrt.plugins, "using_dynamic_plugins", lambda: False)
    monkeypatch.setattr(pjrt.runtime, "device_type", lambda: "TPU")
    monkeypatch.setattr(pjrt.xm, "get_xla_supported_devices", lambda: [])
    monkeypatch.setattr(pjrt.xm, "set_replication", lambda device, devices: None)
    monkeypatch.setattr(torch_xla, "device", lambda: None)

    def run(metadata, local_rank=None, local_world_size=None):
        monkeypatch.setattr(tpu, "_get_metadata", metadata.__getitem__)
        before = dict(os.environ)
        # Other tests in this process may have started the runtime already; the guard
        # applies where it has not.
        started_before = torch_xla._XLAC._xla_runtime_is_initialized()
        if local_world_size is None:
            pjrt.initialize_singleprocess()
        else:
            pjrt.initialize_multiprocess(local_rank, local_world_size)
        assert started_before or not torch_xla._XLAC._xla_runtime_is_initialized(), \
            "the simulated torch_xla spawn started the XLA runtime; a stub is missing"
        return {k: v for k, v in os.environ.items() if before.get(k) != v}

    return run


def _differences(label, expected, got):
    lines = [f"  {key}: torch_xla sets {expected.get(key, '<unset>')!r}, "
             f"worker_env gives {got.get(key, '<unset>')!r}"
             for key in sorted(expected.keys() | got.keys()) if expected.get(key) != got.get(key)]
    return f"{label}: worker_env differs from torch_xla's spawn in {len(lines)} variable(s):\n" + "\n".join(lines)


@pytest.mark.parametrize("name,host,rank", RANKS)
def test_worker_env_matches_torch_xla(name, host, rank, torch_xla_spawn_env):
    s = SLICES[name]
    expected = torch_xla_spawn_env(s.metadata(host), rank, s.chips_per_host)
    got = worker_env(s.topology(host), rank, s.chips_per_host)
    assert got == expected, _differences(f"{name} host {host} local rank {rank}", expected, got)


@pytest.mark.parametrize("name", SINGLE_HOST)
def test_single_process_env_matches_torch_xla(name, torch_xla_spawn_env):
    s = SLICES[name]
    expected = torch_xla_spawn_env(s.metadata(0))
    got = worker_env(s.topology(0), 0, 1)
    assert got == expected, _differences(f"{name} single process (xmp.spawn nprocs=1)", expected, got)


def test_worker_env_honours_base_port():
    env = worker_env(SLICES["v4-16"].topology(1), 2, 4, base_port=9000)
    assert env["TPU_PROCESS_PORT"] == "9002", \
        f"TPU_PROCESS_PORT for rank 2 from base_port 9000: expected '9002', got {env['TPU_PROCESS_PORT']!r}"
    expected = "10.164.0.10:9000,10.164.0.10:9001,10.164.0.10:9002,10.164.0.10:9003," \
               "10.164.0.11:9000,10.164.0.11:9001,10.164.0.11:9002,10.164.0.11:9003"
    assert env["TPU_PROCESS_ADDRESSES"] == expected, \
        f"TPU_PROCESS_ADDRESSES from base_port 9000: expected {expected!r}, got {env['TPU_PROCESS_ADDRESSES']!r}"


def _assert_one_sentence(error):
    message = str(error)
    assert message.endswith(".") and "\n" not in message and ". " not in message, \
        f"error message should be one sentence, got {message!r}"


@pytest.mark.parametrize("slice_name,local_rank,local_world_size,base_port,match", [
    pytest.param("v4-8", 4, 4, 8476, r"local_rank=4 must be in 0\.\.3", id="rank-too-high"),
    pytest.param("v4-8", -1, 4, 8476, r"local_rank=-1 must be in 0\.\.3", id="rank-negative"),
    pytest.param("v4-8", 0, 8, 8476, r"local_world_size=8 must be between 1 and the 4 TPU chips",
                 id="more-processes-than-chips"),
    pytest.param("v4-8", 0, 0, 8476, r"local_world_size=0 must be between 1 and the 4 TPU chips",
                 id="no-processes"),
    pytest.param("v4-8", 0, 2, 8476, r"local_world_size=2 must be 4, one process per chip",
                 id="some-but-not-all-chips"),
    pytest.param("v4-16", 0, 1, 8476, r"local_world_size=1 must be 4, one process per chip",
                 id="one-process-on-multi-host"),
    pytest.param("v4-8", 0, 4, 65534, r"base_port=65534 leaves no room for 4", id="ports-past-65535"),
    pytest.param("v4-8", 0, 4, 0, r"base_port=0 leaves no room for 4", id="port-zero"),
])
def test_worker_env_rejects_bad_input(slice_name, local_rank, local_world_size, base_port, match):
    with pytest.raises(ValueError, match=match) as error:
        worker_env(SLICES[slice_name].topology(0), local_rank, local_world_size, base_port)
    _assert_one_sentence(error.value)


@pytest.mark.parametrize("fields,match", [
    pytest.param(dict(accelerator_type="gpu-8"), r"'gpu-8' is not of the form", id="accelerator-type"),
    pytest.param(dict(host_bounds=(1, 2)), r"host_bounds must be three positive integers, got \(1, 2\)",
                 id="two-bounds"),
    pytest.param(dict(chips_per_host_bounds=(2, 0, 1)), r"chips_per_host_bounds must be three positive integers",
                 id="zero-bound"),
    pytest.param(dict(worker_ips=("10.0.0.1",)), r"worker_ips lists 1 hosts but host_bounds \(1, 1, 2\) describe 2",
                 id="too-few-worker-ips"),
    pytest.param(dict(worker_id=2), r"worker_id 2 is outside the slice's 2 hosts", id="worker-id"),
])
def test_topology_rejects_bad_input(fields, match):
    good = dict(accelerator_type="v4-16", host_bounds=(1, 1, 2), chips_per_host_bounds=(2, 2, 1),
                worker_id=0, worker_ips=("10.0.0.1", "10.0.0.2"))
    with pytest.raises(ValueError, match=match) as error:
        TpuTopology(**{**good, **fields})
    _assert_one_sentence(error.value)


GOOGLE = "0x1ae0"


def make_pci_tree(root, devices):
    """A fake /sys/bus/pci/devices: symlinks to device folders holding `vendor` and `device`."""
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for slot, (vendor, device) in enumerate(devices):
        address = f"0000:00:{slot + 4:02x}.0"
        folder = root / "devices" / "pci0000:00" / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
        (bus / address).symlink_to(folder)
    return bus


def test_count_tpu_chips_counts_only_google_tpus(tmp_path):
    bus = make_pci_tree(tmp_path, [
        (GOOGLE, "0x005e"),    # TPU v4
        (GOOGLE, "0x0063"),    # TPU v5e
        (GOOGLE, "0x0027"),    # TPU v2/v3
        (GOOGLE, "0x0042"),    # Google gVNIC network card, not a TPU
        ("0x8086", "0x005e"),  # another vendor's device that happens to share a TPU id
        ("0x1af4", "0x1000"),  # virtio
    ])
    assert count_tpu_chips(bus) == 3, \
        f"expected 3 TPU chips among 6 PCI devices, count_tpu_chips found {count_tpu_chips(bus)}"


def test_count_tpu_chips_without_pci_bus(tmp_path):
    found = count_tpu_chips(tmp_path / "no-such-bus")
    assert found == 0, f"a missing PCI sysfs folder should mean 0 TPU chips, got {found}"


def _fail_metadata(key, timeout):
    raise AssertionError(f"detect_topology queried TPU metadata {key!r} when it should not have")


def test_detect_topology_without_tpu_chips(tmp_path, monkeypatch):
    monkeypatch.setattr(tpu_topology, "_metadata", _fail_metadata)
    bus = make_pci_tree(tmp_path, [(GOOGLE, "0x0042"), ("0x8086", "0x1237")])
    found = detect_topology({}, sysfs_root=bus)
    assert found is None, f"a host without TPU chips should give None, got {found!r}"


@pytest.mark.parametrize("name,host", HOSTS)
def test_detect_topology_from_metadata(name, host, tmp_path, monkeypatch):
    s = SLICES[name]
    metadata = s.metadata(host)
    monkeypatch.setattr(tpu_topology, "_metadata", lambda key, timeout: metadata[key])
    bus = make_pci_tree(tmp_path, [(GOOGLE, "0x005e")] * s.chips_per_host)
    found = detect_topology({}, sysfs_root=bus)
    assert found == s.topology(host), \
        f"{name} host {host}: from metadata {metadata!r} expected {s.topology(host)!r}, got {found!r}"


def test_detect_topology_over_http(tmp_path, monkeypatch):
    """The real request path, against a stand-in metadata server that, like GCE's,
    refuses requests without the Metadata-Flavor header."""
    s = SLICES["v4-16"]
    metadata = s.metadata(1)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), metadata_server.Handler(metadata))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(tpu_topology, "_METADATA_URL",
                            f"http://127.0.0.1:{server.server_port}/computeMetadata/v1/instance/attributes/")
        bus = make_pci_tree(tmp_path, [(GOOGLE, "0x005e")] * 4)
        found = detect_topology({}, sysfs_root=bus)
    finally:
        server.shutdown()
        server.server_close()
    assert found == s.topology(1), \
        f"v4-16 host 1 over HTTP: expected {s.topology(1)!r}, got {found!r}"


def test_detect_topology_from_environment(tmp_path, monkeypatch):
    """On GKE (TPU_SKIP_MDS_QUERY) the topology comes from TPU_* variables, not metadata."""
    monkeypatch.setattr(tpu_topology, "_metadata", _fail_metadata)
    bus = make_pci_tree(tmp_path, [(GOOGLE, "0x005e")] * 4)
    environ = {
        "TPU_SKIP_MDS_QUERY": "true",
        "TPU_ACCELERATOR_TYPE": "v4-16",
        "TPU_HOST_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "10.164.0.10,10.164.0.11",
    }
    found = detect_topology(environ, sysfs_root=bus)
    expected = SLICES["v4-16"].topology(1)
    assert found == expected, f"from environment {environ!r} expected {expected!r}, got {found!r}"


def test_detect_topology_names_missing_environment_variable(tmp_path):
    bus = make_pci_tree(tmp_path, [(GOOGLE, "0x005e")] * 4)
    with pytest.raises(RuntimeError, match="no TPU_ACCELERATOR_TYPE in the environment"):
        detect_topology({"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_ID": "0"}, sysfs_root=bus)


def test_detect_topology_when_metadata_server_is_unreachable(tmp_path, monkeypatch):
    def unreachable(key, timeout):
        raise urllib.error.URLError("timed out")

    monkeypatch.setattr(tpu_topology, "_metadata", unreachable)
    bus = make_pci_tree(tmp_path, [(GOOGLE, "0x005e")] * 4)
    with pytest.raises(RuntimeError, match="TPU chips but its TPU metadata could not be read"):
        detect_topology({}, sysfs_root=bus)


def test_launcher_safe_modules_never_import_torch_xla(tmp_path):
    """Discovery (device kind and count, TPU topology, the worker environment) runs in the launcher
    parent, which must not start the XLA runtime (it would claim the workers' chips): these
    modules, imported and used in a fresh interpreter, leave torch_xla unimported."""
    bus = make_pci_tree(tmp_path, [(GOOGLE, "0x005e")] * 4)
    script = """
import sys
from xla_host import discovery, import_hooks, tpu_topology
from deepspeed_xla import backend
from deepspeed_xla.patches import launch
from deepspeed_xla.backend import pjrt_env
environ = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v4-8", "TPU_PROCESS_BOUNDS": "1,1,1",
           "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1", "TPU_WORKER_ID": "0"}
assert tpu_topology.count_tpu_chips(sys.argv[1]) == 4
topology = tpu_topology.detect_topology(environ, sysfs_root=sys.argv[1])
pjrt_env.worker_env(topology, 0, topology.chips_per_host)
assert discovery.device_type({"PJRT_DEVICE": "CPU"}) == "CPU"
assert discovery.local_device_count({"PJRT_DEVICE": "CPU", "DS_XLA_CPU_DEVICES": "3"}) == 3
worker = {"LOCAL_RANK": "1", "LOCAL_SIZE": "4", "PJRT_DEVICE": "TPU"}
pjrt_env.apply_tpu_worker_env(worker, topology=topology)
assert worker["TPU_VISIBLE_CHIPS"] == "1", worker
if "torch_xla" in sys.modules:
    sys.exit("the launcher-safe modules imported torch_xla")
"""
    result = subprocess.run([sys.executable, "-c", script, str(bus)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, \
        f"fresh interpreter exited {result.returncode}: {result.stderr[-2000:]}"


# -- tox -e tpu preflight (scripts/tpu_preflight.py) ---------------------------------------
PCI_ID = {"v4-8": "0x005e", "v5e-8": "0x0063", "v5p-8": "0x0062", "v4-16": "0x005e"}


def load_preflight():
    spec = importlib.util.spec_from_file_location("tpu_preflight", REPO / "scripts" / "tpu_preflight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.preflight


def make_proc_tree(root, holders):
    """A fake /proc: holders maps a pid to the device files it has open."""
    for pid, devices in holders.items():
        fds = root / str(pid) / "fd"
        fds.mkdir(parents=True)
        (fds / "0").symlink_to("/dev/null")
        for number, device in enumerate(devices, 3):
            (fds / str(number)).symlink_to(device)
    return root


@pytest.mark.parametrize("name, host", [p.values for p in HOSTS if p.values[0] in PCI_ID])
def test_preflight_on_a_free_tpu_vm(name, host, tmp_path):
    chips = SLICES[name].chips_per_host
    bus = make_pci_tree(tmp_path / "sys", [(GOOGLE, PCI_ID[name])] * chips + [("0x1af4", "0x1000")])
    proc = make_proc_tree(tmp_path / "proc", {100: ["/dev/null"], 200: []})
    status, line = load_preflight()(bus, proc, own_pid=1)
    assert (status, line) == (0, f"tox -e tpu: {chips} TPU chips on this host, none held by another process")


def test_preflight_names_the_processes_holding_the_chips(tmp_path):
    bus = make_pci_tree(tmp_path / "sys", [(GOOGLE, "0x0063")] * 8)
    proc = make_proc_tree(tmp_path / "proc", {4242: ["/dev/vfio/0", "/dev/vfio/1"], 77: ["/dev/accel3"], 5: []})
    status, line = load_preflight()(bus, proc, own_pid=1)
    assert status == 2 and "\n" not in line
    assert line.startswith("tox -e tpu: the TPU chips are held by processes 77, 4242 (/dev/accel3, /dev/vfio/0, "
                           "/dev/vfio/1); stop them first")


def test_preflight_without_tpu_chips_is_one_line_and_exit_2():
    if count_tpu_chips():
        pytest.skip("this host has TPU chips: the simulated hosts above cover the preflight here")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "tpu_preflight.py")], capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert "has no TPU chips on its PCI bus; run it on a TPU VM" in proc.stderr
