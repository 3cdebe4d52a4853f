"""Parameters keep their identity when a module moves to or from an XLA device.

DeepSpeed, like most PyTorch code, assumes that `module.to(device)` changes where a
module's parameters live but not which `Parameter` objects they are: the list passed as
`model_parameters`, the param groups of a client optimizer, an LR scheduler bound to that
optimizer, and weights tied between two modules all hold the objects made on the CPU.
On CUDA that holds, because `Module._apply` moves a parameter in place (`param.data =
moved`). CPU and XLA tensors have different tensor implementations, which `.data =`
cannot exchange, so for a move to XLA `Module._apply` builds a *new* Parameter instead:
everything that held the old one now holds a stale CPU tensor (ZeRO-0 silently trains
nothing, ZeRO-1/2 fail with `KeyError: Parameter`, ZeRO-3 with a missing
`partition_numel`, tied weights drift apart).

The mechanism: `install()` wraps `torch.nn.Module._apply` once per process. After the
original has run for a module, every parameter it replaced in a move that involves an
XLA device gets its old object back, now holding the moved tensor: the two objects
exchange their tensor implementations (`torch._C._swap_tensor_impl`, the step under
`torch.utils.swap_tensors` that PyTorch's own opt-in
`torch.__future__.set_swap_module_params_on_conversion` uses). Unlike that opt-in, the
Python object keeps its attributes (`ds_*`, MoE `allreduce`/`group_name` marks, ...) and
its weak references (DeepSpeed keeps some), exactly as `.data =` would on CUDA. Moves
that do not involve XLA, and processes that opted into either of torch's
`torch.__future__` conversion flags, are left to PyTorch.

Code that moves a tensor itself, `tensor.data = tensor_on_another_device`, works between
CPU and CUDA tensors but PyTorch refuses it between a CPU and an XLA tensor ("incompatible
tensor type"). DeepSpeed does it to parameters where `deepspeed.zero.Init(module=model)`
converts a model built on the CPU and where ZeRO-3 gathers into a parameter the user moved to
the CPU, and to plain tensors in `engine.offload_states()`/`reload_states()` (fp32 master
partitions, flat bf16 buffers, gradient partitions, optimizer states). So `install()` also
gives `torch.Tensor` a `data` property: an assignment PyTorch accepts is PyTorch's own; one
it refuses across the XLA boundary is done by the same exchange, with a new tensor aliasing
the assigned one, so the object shares that tensor's storage as `.data =` makes it.

Limits: a tensor still referenced from elsewhere in C++ (a view of it, an autograd graph
built on the CPU and not yet run backward), one that holds a gradient, and one that is not a
leaf cannot be exchanged safely; it keeps PyTorch's behaviour (a module's move makes a new
Parameter, with a warning naming it; `.data =` is refused as above).
"""

import functools
import warnings

import torch

from ..backend import DEVICE_TYPE

# PyTorch's own `.data` (a C getset descriptor on TensorBase), which the property installed on Parameter defers to.
_TENSOR_DATA = torch._C.TensorBase.data
_original_apply = None


def install():
    """Wrap `torch.nn.Module._apply` and give `torch.Tensor` its cross-device `data` setter, so XLA moves
    keep tensor identity (idempotent)."""
    global _original_apply
    if _original_apply is not None:
        return
    _original_apply = torch.nn.Module._apply

    @functools.wraps(_original_apply)
    def _apply(module, fn, recurse=True):
        before = dict(module._parameters)
        result = _original_apply(module, fn, recurse)
        restore_identity(module, before)
        return result

    torch.nn.Module._apply = _apply
    torch.Tensor.data = property(_get_data, _set_data, doc=_TENSOR_DATA.__doc__)


def uninstall():
    """Put PyTorch's own `Module._apply` and `Tensor.data` back (for tests, and for candidates built without
    this)."""
    global _original_apply
    if _original_apply is not None:
        torch.nn.Module._apply = _original_apply
        _original_apply = None
        del torch.Tensor.data


def _get_data(tensor):
    return _TENSOR_DATA.__get__(tensor)


def _set_data(tensor, value):
    try:
        _TENSOR_DATA.__set__(tensor, value)
    except RuntimeError:
        # PyTorch refuses set_data between tensor types; nothing has changed yet, so the exchange may try
        if not (isinstance(value, torch.Tensor) and _involves_xla(tensor, value) and tensor.is_leaf
                and tensor.grad is None):
            raise
        _assign(tensor, value)


def _assign(tensor, value):
    """`tensor.data = value` done by exchange, with what set_data keeps between CPU and CUDA tensors: the object,
    its `requires_grad` and its hooks. Views taken of `tensor` before keep the old values, as they keep the old
    storage under set_data. An autograd graph built on the old tensor is poisoned (its backward raises), as
    `torch.utils.swap_tensors` does, rather than accumulating a gradient nobody reads."""
    count = tensor._use_count()
    edge = torch.autograd.graph.get_gradient_edge(tensor) if tensor.requires_grad else None
    if edge is not None and tensor._use_count() == count:  # the node existed before: a graph holds it
        edge.node.register_prehook(_stale_graph)
    del edge
    _swap(tensor, value.detach().requires_grad_(tensor.requires_grad))


def _stale_graph(grad_outputs):
    raise RuntimeError("deepspeed_xla: backward reached a tensor whose `.data` was assigned across the XLA boundary "
                       "after this graph was built; run the forward again after moving it.")


def _involves_xla(old, new):
    return old.device.type == DEVICE_TYPE or new.device.type == DEVICE_TYPE


def _torch_handles_identity():
    return (torch.__future__.get_swap_module_params_on_conversion()
            or torch.__future__.get_overwrite_module_params_on_conversion())


def _exchangeable(tensor):
    """True when only the Python object (and at most the AccumulateGrad node of a leaf)
    refers to the tensor implementation, the condition `torch.utils.swap_tensors` sets."""
    count = tensor._use_count()
    if count == 1:
        return True
    if count == 2 and tensor.is_leaf and tensor.requires_grad:
        torch.autograd.graph.get_gradient_edge(tensor)  # the node itself holds the second reference
        return tensor._use_count() == 2
    return False


def restore_identity(module, before):
    """Give back to `module` the Parameter objects of `before` ({name: parameter}, its
    `_parameters` before a conversion) that the conversion replaced in a move to or from
    XLA, each now holding its moved tensor. Returns the names restored."""
    if _torch_handles_identity():
        return []
    restored = []
    for name, old in before.items():
        new = module._parameters.get(name)
        if old is None or new is None or new is old or not isinstance(new, torch.nn.Parameter):
            continue
        if not _involves_xla(old, new):
            continue
        if not _exchange(old, new):
            warnings.warn(f"deepspeed_xla: {type(module).__name__}.{name} moved to {new.device} as a new Parameter "
                          "object, because another tensor still refers to the old one (a view of it, or an autograd "
                          "graph not run backward yet); optimizers and lists made before the move still hold the "
                          "old one. Move the model before taking views of its parameters.", stacklevel=3)
            continue
        module._parameters[name] = old
        restored.append(name)
    return restored


def _exchange(old, new):
    """Give `old` the tensor implementation of `new` (and `new` old's) when nothing else refers to either; whether it
    did."""
    if not (_exchangeable(old) and _exchangeable(new)):
        return False
    _swap(old, new)
    return True


def _swap(old, new):
    """Exchange the tensor implementations of `old` and `new`. The hooks registered through `old`'s Python object
    are registered again on the implementation it now holds, as they lived on the one it gave away."""
    torch._C._swap_tensor_impl(old, new)
    for hooks in ("_backward_hooks", "_post_accumulate_grad_hooks"):
        registered = getattr(old, hooks)
        if registered is not None:
            setattr(old, hooks, registered)
