"""Parameters keep their identity when a module moves to or from XLA (deepspeed_xla.patches.param_identity),
on a real PJRT CPU device: what every list, optimizer and tied weight made before
`deepspeed.initialize` relies on. Without the mechanism, each check here fails (see
test_without_it_pytorch_replaces_parameters)."""

import gc
import textwrap
import warnings
import weakref

import pytest
import torch
import torch_xla
from helpers import last_json, run_python

from deepspeed_xla.patches import param_identity
from harness.launching import single_rank_env

XLA = torch_xla.device()


@pytest.fixture(autouse=True)
def installed():
    param_identity.install()
    yield
    param_identity.install()


class Tied(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight


def _snapshot(model):
    return [(p, p.detach().clone()) for p in model.parameters()]


def test_move_to_xla_keeps_objects_values_and_ties():
    torch.manual_seed(0)
    model = Tied()
    before = _snapshot(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model.to(XLA)
    after = list(model.parameters())
    assert [id(p) for p in after] == [id(p) for p, _ in before], "the module holds new Parameter objects"
    assert model.head.weight is model.embed.weight, "the tied weight came apart"
    assert all(p.device.type == "xla" for p in after)
    assert all(torch.equal(p.cpu(), value) for p, value in before), "values changed in the move"
    assert all(p.device.type == "xla" for p in optimizer.param_groups[0]["params"])


def test_the_optimizer_made_before_the_move_trains_the_moved_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to(XLA)
    start = model.weight.detach().cpu().clone()
    model(torch.ones(2, 3, device=XLA)).sum().backward()
    optimizer.step()
    assert not torch.equal(model.weight.detach().cpu(), start), "the optimizer updated a stale copy, not the model"


def test_attributes_weakrefs_and_grads_stay_with_the_object():
    model = torch.nn.Linear(2, 2)
    model.weight.ds_marker = "kept"  # DeepSpeed and MoE mark parameters with attributes
    finalized = []
    weakref.finalize(model.weight, finalized.append, True)  # DeepSpeed keeps such finalizers on parameters
    model(torch.ones(1, 2)).sum().backward()
    grad = model.weight.grad.clone()
    weight = model.weight
    model.to(XLA)
    assert model.weight is weight and weight.ds_marker == "kept"
    assert weight.grad is not None and weight.grad.device.type == "xla" and torch.equal(weight.grad.cpu(), grad)
    gc.collect()
    assert not finalized, "the finalizer ran: the old object was treated as dead"


def test_back_to_cpu_keeps_identity_too():
    model = torch.nn.Linear(2, 2).to(XLA)
    weight = model.weight
    model.to("cpu")
    assert model.weight is weight and weight.device.type == "cpu"


def test_moves_without_xla_are_left_to_pytorch():
    model = torch.nn.Linear(2, 2)
    weight = model.weight
    model.to(torch.float64)
    assert model.weight is weight and weight.dtype == torch.float64  # PyTorch's own in-place `.data =`


def test_a_parameter_with_a_live_view_moves_as_pytorch_does_with_a_warning():
    model = torch.nn.Linear(2, 2)
    weight = model.weight
    view = weight[0]  # noqa: F841  (the view keeps a second reference to the tensor)
    with pytest.warns(UserWarning, match="Linear.weight moved to xla:0 as a new Parameter"):
        model.to(XLA)
    assert model.weight is not weight and model.weight.device.type == "xla"


def test_torch_swap_flag_is_left_to_pytorch(monkeypatch):
    monkeypatch.setattr(torch.__future__, "get_swap_module_params_on_conversion", lambda: True)
    assert param_identity.restore_identity(torch.nn.Linear(1, 1), {}) == []


def test_without_it_pytorch_replaces_parameters():
    param_identity.uninstall()
    model = Tied()
    weight = model.embed.weight
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.to(XLA)
    assert model.embed.weight is not weight, "PyTorch now keeps identity itself: param_identity may be obsolete"
    assert model.head.weight is not model.embed.weight


def test_data_assigned_across_the_xla_boundary_keeps_the_object_and_aliases_the_tensor():
    """`param.data = tensor` from a CPU to an XLA tensor (PyTorch refuses it: "incompatible tensor type") and back:
    the same object, its attributes, weak references and requires_grad, sharing the assigned tensor's storage."""
    param = torch.nn.Parameter(torch.ones(3))
    param.ds_id = 7
    ref = weakref.ref(param)
    on_xla = torch.arange(3.0, device=XLA)
    param.data = on_xla
    assert (param.device.type, param.ds_id, ref() is param, param.requires_grad) == ("xla", 7, True, True)
    on_xla.add_(10)
    assert param.detach().cpu().tolist() == [10.0, 11.0, 12.0]
    (param * 2).sum().backward()
    assert param.grad.cpu().tolist() == [2.0, 2.0, 2.0]
    param.grad = None
    param.data = torch.zeros(2)
    assert (param.device.type, param.tolist(), ref() is param) == ("cpu", [0.0, 0.0], True)


def test_data_assigned_across_the_boundary_to_a_parameter_holding_a_gradient_is_refused_as_pytorch_does():
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        param.data = torch.zeros(2, device=XLA)
    assert param.device.type == "cpu" and param.tolist() == [1.0, 1.0]


def test_data_of_a_plain_tensor_moves_across_the_boundary_and_back_as_the_same_object():
    """What `engine.offload_states()`/`reload_states()` do to ZeRO's flat buffers and Adam moments."""
    moment = torch.zeros(3, device=XLA)
    master = torch.ones(3, device=XLA).requires_grad_()
    host = torch.arange(3.0)
    for tensor in (moment, master):
        ref = weakref.ref(tensor)
        tensor.data = host
        assert (tensor.device.type, tensor.tolist(), ref() is tensor) == ("cpu", [0.0, 1.0, 2.0], True)
        host.add_(1)  # the object shares the assigned tensor's storage, as `.data =` makes it
        assert tensor.tolist() == [1.0, 2.0, 3.0]
        host.sub_(1)
        tensor.data = tensor.data.to(XLA)
        assert (tensor.device.type, ref() is tensor) == ("xla", True)
    assert (moment.requires_grad, master.requires_grad) == (False, True)


def test_views_taken_before_the_assignment_keep_the_old_values_as_under_set_data():
    """DeepSpeed's ZeRO-1/2 keeps views of each parameter (`_hp_mapping`) while `reload_states()` assigns it."""
    param = torch.nn.Parameter(torch.ones(4))
    fragment = param.flatten().narrow(0, 0, 2)
    param.data = torch.zeros(4, device=XLA)
    assert (param.device.type, param.detach().cpu().tolist(), fragment.tolist()) == ("xla", [0.0] * 4, [1.0, 1.0])


def test_gradient_hooks_survive_the_assignment():
    """ZeRO-1/2 reduces each gradient from a post-accumulate-grad hook on the parameter; an assignment that lost it
    would leave every later step without its gradient reduction."""
    param = torch.nn.Parameter(torch.ones(2, device=XLA))
    fired = []
    param.register_post_accumulate_grad_hook(lambda p: fired.append("post-accumulate"))
    param.register_hook(lambda grad: fired.append("tensor") or grad * 3)
    param.data = param.data.to("cpu")
    param.data = param.data.to(XLA)
    (param * 2).sum().backward()
    assert fired == ["tensor", "post-accumulate"]
    assert param.grad.cpu().tolist() == [6.0, 6.0]


def test_backward_through_a_graph_built_before_the_assignment_raises():
    """As `torch.utils.swap_tensors` poisons it: the gradient would go to the tensor the object gave away."""
    param = torch.nn.Parameter(torch.ones(2))
    loss = (param * 2).sum()
    param.data = torch.zeros(2, device=XLA)
    with pytest.raises(RuntimeError, match="assigned across the XLA boundary after this graph was built"):
        loss.backward()


def test_zero_init_of_a_model_built_on_the_cpu_keeps_its_parameters():
    """`deepspeed.zero.Init(module=model)` converts a model built on the CPU; DeepSpeed moves each parameter with
    `param.data = ...to(device)`, which PyTorch refuses from CPU to XLA. The parameters become ZeRO-3 parameters on
    the device as the same objects, with their values, attributes and weak references."""
    code = textwrap.dedent("""
        import json, weakref, torch, deepspeed
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
        deepspeed.init_distributed()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        params, before = list(model.parameters()), [p.detach().clone() for p in model.parameters()]
        model.weight.tag = "mine"
        ref = weakref.ref(model.weight)
        deepspeed.zero.Init(module=model, config_dict_or_path={"train_micro_batch_size_per_gpu": 1,
                                                               "zero_optimization": {"stage": 3}})
        partitioned = [p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in params]
        with deepspeed.zero.GatheredParameters(params):
            values = [torch.equal(p.detach().cpu(), b) for p, b in zip(params, before)]
            out = model(torch.ones(2, 4, device=params[0].device)).detach().cpu()
        print(json.dumps({"same": [a is b for a, b in zip(model.parameters(), params)], "values": values,
                          "partitioned": partitioned, "device": params[0].ds_tensor.device.type,
                          "kept": [getattr(params[0], "tag", None), ref() is params[0]],
                          "forward": torch.allclose(out, torch.ones(2, 4) @ before[0].T + before[1])}))
    """)
    result = last_json(run_python(code, "xla", single_rank_env()))
    assert result == {"same": [True, True], "values": [True, True], "partitioned": [True, True], "device": "xla",
                      "kept": ["mine", True], "forward": True}, result
