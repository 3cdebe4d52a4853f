"""Device naming, selection, counting, synchronisation and placement (DeepSpeedAccelerator device APIs).

DeepSpeed builds devices as torch.device(device_name(local_rank)), torch.device(device_name(), i)
and compares them with current_device_name(); index forms are ints, strings and torch.device.
"""


from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from assertions import assert_tensor, returns_index
from conformance_helpers import INDEX_FORMS, host, run_fresh
from xla_probe import RUNTIME_STARTED_SOURCE, pending_ops

pytestmark = pytest.mark.area("interface")


@pytest.fixture(autouse=True)
def no_local_rank(monkeypatch):
    # Outside a launched rank, device index i names local XLA device i.
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_device_name__no_index(accel):
    name = accel.device_name()
    assert name == "xla", (f"device_name() returned {name!r}; DeepSpeed builds torch.device(device_name(), index) "
                           "from it, so it must be the bare device type 'xla'")


def _lands_on(name, xla_device):
    """None when a tensor created on device `name` lands on this process's device, else why not."""
    try:
        device = torch.zeros(1, device=torch.device(name)).device
    except (RuntimeError, ValueError) as err:
        return f"{name!r} is not a device this process can use ({type(err).__name__}: {str(err)[:120]})"
    return None if device == xla_device else f"{name!r} puts tensors on {device}, not on {xla_device}"


# DeepSpeed names a rank's device by its local rank (set_device(local_rank),
# torch.device(device_name(local_rank))): in a launched rank, the local rank in every form must
# name the one device the process owns. (Which device another index names is the candidate's
# choice: a process with one visible TPU chip may map every index to it.)
@pytest.mark.parametrize("form", INDEX_FORMS)
@pytest.mark.parametrize("local_rank", [0, 1], ids=["rank0", "rank1"])
def test_device_name(accel, xla_device, monkeypatch, form, local_rank):
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    index = INDEX_FORMS[form](local_rank)
    name = accel.device_name(index)
    problem = _lands_on(name, xla_device)
    assert problem is None, (f"in a launched rank with LOCAL_RANK={local_rank}, device_name({index!r}) returned "
                             f"{name!r}: {problem}; DeepSpeed puts the rank's tensors there")


def test_device_name__outside_a_launched_rank(accel, xla_device, evidence):
    name = accel.device_name(0)
    evidence["device_name(1)"] = accel.device_name(1)  # information: the candidate's choice, DeepSpeed never asks
    problem = _lands_on(name, xla_device)
    assert problem is None, f"with no LOCAL_RANK (one process, one device), device_name(0) returned {name!r}: {problem}"


def test_device_name__usable_by_torch(accel):
    assert_tensor(torch.arange(3, device=torch.device(accel.device_name(0))), "arange(3) created on device_name(0)",
                  device_type="xla", values=[0, 1, 2])


@pytest.mark.parametrize("form", INDEX_FORMS)
def test_device(accel, form):
    index = INDEX_FORMS[form](0)
    device = accel.device(index)
    # DeepSpeed assigns device() to engine.device (local rank -1) and passes it to
    # init_process_group(device_id=...): CUDA's accelerator returns a torch.device.
    assert isinstance(device, torch.device) and device.type == "xla", (
        f"device({index!r}) returned {device!r} ({type(device).__name__}); DeepSpeed uses it as a torch.device "
        "(engine.device, init_process_group's device_id), as CUDA's accelerator returns")
    assert_tensor(torch.zeros(2).to(device), f"zeros(2).to(device({index!r}))", device_type="xla")
    with device:  # activation checkpointing also enters it as a context
        tensor = torch.ones(2, device=accel.device_name(index)) * 3
    assert_tensor(tensor, f"ones(2) * 3 inside `with device({index!r})`", values=[3.0, 3.0])


class _TiedModel(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def test_device_name__module_move_keeps_parameter_identity(accel):
    # DeepSpeed's engine moves the user's model with module.to(device_name(local_rank)) after the user
    # made parameter lists, param groups and optimizers from it; on CUDA they still name the moved
    # parameters, and DeepSpeed relies on it (ZeRO-1/2 look parameters up by object).
    model = _TiedModel()
    before = list(model.parameters())
    values = [p.detach().clone() for p in before]
    optimizer = torch.optim.SGD(before, lr=0.1)
    model.to(accel.device_name(0))
    after = list(model.parameters())
    problems = []
    if [id(p) for p in after] != [id(p) for p in before]:
        problems.append("the module holds new Parameter objects after the move, so lists and optimizers made "
                        "before it hold stale CPU copies")
    if model.head.weight is not model.embed.weight:
        problems.append("the tied weight became two Parameters (head and embedding drift apart)")
    stale = [tuple(p.shape) for p in optimizer.param_groups[0]["params"] if p.device.type != "xla"]
    if stale:
        problems.append(f"the optimizer made before the move still holds CPU parameters of shapes {stale}")
    moved = [p for p in after if p.device.type == "xla"]
    if len(moved) != len(after) or any(not torch.equal(host(p), v) for p, v in zip(after, values)):
        problems.append("the parameters are not on XLA with their values after the move")
    assert not problems, "module.to(device_name(0)): " + "; ".join(problems)


@pytest.mark.parametrize("form", INDEX_FORMS)
@pytest.mark.parametrize("local_rank", [0, 1], ids=["rank0", "rank1"])
def test_set_device(accel, restore_device, xla_device, monkeypatch, form, local_rank):
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    index = INDEX_FORMS[form](local_rank)
    accel.set_device(index)
    current, name = accel.current_device(), accel.current_device_name()
    problem = _lands_on(name, xla_device)
    assert problem is None, (f"in a launched rank with LOCAL_RANK={local_rank}, after set_device({index!r}) "
                             f"current_device_name() is {name!r}: {problem}")
    assert accel.device_name(current) == name, (f"after set_device({index!r}), device_name(current_device()) = "
                                                f"{accel.device_name(current)!r} but current_device_name() = {name!r}")


def test_current_device(accel):
    current = returns_index(accel, "current_device")
    assert accel.device_name(current) == accel.current_device_name(), (
        f"device_name(current_device()) = {accel.device_name(current)!r} but current_device_name() = "
        f"{accel.current_device_name()!r}")


def test_current_device_name(accel):
    name = accel.current_device_name()
    assert isinstance(name, str) and name.startswith("xla"), f"current_device_name() returned {name!r}"
    assert_tensor(torch.full((2, ), 5.0, device=name), f"full((2,), 5.0) created on current_device_name() = {name!r}",
                  device_type="xla", values=[5.0, 5.0])


# The launcher parent counts devices before any worker starts; on a TPU host the process that
# starts the XLA runtime owns the chips, so counting must not start it. Checked in fresh processes,
# one per method: a method called after another could use what the first one left (a cached count).
FRESH_METHODS = ("device_count", "is_available")
_FRESH_PROBE = RUNTIME_STARTED_SOURCE + """
import json
after_install = runtime_started()
value = accel.{method}()
print(json.dumps({{"after_install": after_install, "after_call": runtime_started(), "value": value,
                  "type": type(value).__name__}}))
"""


@pytest.fixture(scope="module")
def fresh_probes(candidate):
    """{method: probe result} for FRESH_METHODS, each called in a fresh process of its own (side by side)."""
    with ThreadPoolExecutor(len(FRESH_METHODS)) as pool:
        probes = pool.map(lambda method: run_fresh(candidate, _FRESH_PROBE.format(method=method)), FRESH_METHODS)
        return dict(zip(FRESH_METHODS, probes))


def _assert_runtime_untouched(probe, method):
    assert not probe["after_install"], "installing the candidate (importing DeepSpeed) started the XLA runtime"
    assert not probe["after_call"], (f"{method}() started the XLA runtime (torch_xla runtime initialised "
                                     "afterwards); the launcher parent would take the devices its workers need")


def test_device_count(fresh_probes, evidence):
    probe = fresh_probes["device_count"]
    evidence.update(probe)
    _assert_runtime_untouched(probe, "device_count")
    assert probe["type"] == "int" and probe["value"] >= 1, (
        f"device_count() returned {probe['value']!r} ({probe['type']}); expected an int >= 1 on an XLA host")


def test_is_available(accel, fresh_probes, evidence):
    probe = fresh_probes["is_available"]
    evidence.update(probe)
    _assert_runtime_untouched(probe, "is_available")
    assert probe["value"] is True and accel.is_available() is True, (
        f"is_available() returned {probe['value']!r} in a fresh process and {accel.is_available()!r} here; "
        "expected True on an XLA host")


@pytest.mark.parametrize("form", [None, *INDEX_FORMS])
def test_synchronize(accel, xla_device, form, evidence):
    tensor = torch.ones(4, device=xla_device) * 2 + 1
    assert pending_ops(tensor), "setup: the lazy tensor should have a pending graph before synchronize()"
    if form is None:
        accel.synchronize()
    else:
        accel.synchronize(INDEX_FORMS[form](0))
    pending = pending_ops(tensor)
    evidence["pending_after_synchronize"] = pending
    assert not pending, (f"after synchronize({'' if form is None else form}), the tensor still has a pending graph "
                         f"({', '.join(pending)}): synchronize must execute queued work and wait for it")
    assert_tensor(tensor, "ones(4) * 2 + 1 after synchronize()", values=[3.0] * 4)


def test_on_accelerator(accel, xla_device):
    on_device = {
        "xla tensor": torch.zeros(3, device=xla_device),
        "xla view": torch.zeros(4, 4, device=xla_device)[1:, ::2],
        "xla op result": torch.zeros(3, device=xla_device) + 1,
        "xla parameter": torch.nn.Parameter(torch.zeros(2, device=xla_device)),
    }
    off_device = {
        "cpu tensor": torch.zeros(3),
        "meta tensor": torch.empty(3, device="meta"),
        "cpu parameter": torch.nn.Parameter(torch.zeros(2)),
    }
    wrong = [f"{name} -> {accel.on_accelerator(t)!r}" for name, t in on_device.items() if accel.on_accelerator(t) is not True]
    wrong += [f"{name} -> {accel.on_accelerator(t)!r}" for name, t in off_device.items() if accel.on_accelerator(t) is not False]
    assert not wrong, f"on_accelerator must be True exactly for XLA tensors; wrong for: {'; '.join(wrong)}"
