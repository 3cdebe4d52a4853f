"""What the launcher and comm setup take from the accelerator (DeepSpeedAccelerator environment
and communication APIs): environment variables to forward and to restrict visible devices, and
the torch.distributed backend DeepSpeed's init_distributed will use."""

import pytest
import torch
import torch.distributed as dist

from assertions import assert_tensor, returns
from conformance_helpers import host

pytestmark = pytest.mark.area("interface")


def _names(accel, method):
    return returns(accel, method, expected="a list of environment variable names",
                   accepts=lambda names: isinstance(names, (list, tuple)) and all(isinstance(n, str) and n for n in names))


def test_export_envs(accel):
    _names(accel, "export_envs")


def test_visible_devices_envs(accel):
    assert _names(accel, "visible_devices_envs"), "visible_devices_envs() is empty; the launcher cannot pin devices"


def test_set_visible_devices_envs(accel):
    env = {"UNRELATED": "kept"}
    accel.set_visible_devices_envs(env, [0, 2])
    for name in accel.visible_devices_envs():
        assert name in env, f"set_visible_devices_envs did not set {name}, one of visible_devices_envs()"
        assert env[name].replace(" ", "").split(",") == ["0", "2"], (
            f"set_visible_devices_envs(env, [0, 2]) set {name}={env[name]!r}; expected the ids 0,2")
    assert env["UNRELATED"] == "kept", "set_visible_devices_envs changed unrelated variables"


def test_communication_backend_name(accel, xla_device, evidence):
    name = accel.communication_backend_name()
    assert isinstance(name, str) and name, f"communication_backend_name() returned {name!r}"
    assert name.lower() in dist.Backend.backend_list or dist.is_backend_available(name), (
        f"torch.distributed does not know backend {name!r}; DeepSpeed's init_distributed would fail")
    # A one-rank group on that backend must carry an all_reduce of an XLA tensor.
    assert not dist.is_initialized(), "setup: a process group is already initialised in this process"
    dist.init_process_group(backend=name, store=dist.HashStore(), rank=0, world_size=1)
    try:
        tensor = torch.arange(4, dtype=torch.float32, device=xla_device)
        dist.all_reduce(tensor)
        evidence["all_reduce_world_1"] = host(tensor).tolist()
        assert_tensor(tensor, f"all_reduce of arange(4) over one {name} rank", values=[0.0, 1.0, 2.0, 3.0])
    finally:
        dist.destroy_process_group()
