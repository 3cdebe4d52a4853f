"""Corrections to PyTorch/XLA operators that DeepSpeed, and the models it trains, depend on.

torch_xla 2.9 lowers `amax`/`amin` called with the default `dim=()` as "reduce over no
dimension" and returns the input unchanged, where PyTorch reduces over every
dimension. DeepSpeed's overflow check (`has_inf_or_nan`: `isfinite(x.amax())`) then
gets a tensor instead of a scalar and fails in bf16/fp16 training. The corrected
kernels reduce one dimension at a time with `max.dim`/`min.dim`, and put NaN back
where the input had one: XLA's max/min drop NaN, PyTorch's propagate it, and the
overflow check depends on that. Autograd keeps using PyTorch's own derivative formulas,
since these kernels sit below the autograd key.

A copy into a slice of a tensor (`bucket.narrow(0, offset, n).copy_(grad)`, how DeepSpeed's ZeRO
stages fill their flat gradient buckets and partitions) reaches XLA as `slice_scatter`, which
torch_xla 2.9 lowers as a select between the base and `src` padded to the base's size: every
element of the base is evaluated per update, and a chain of k updates into one bucket becomes k
masks of the bucket's size per element, which XLA does not fold. ZeRO-3's backward graph of a
4.2M-parameter MLP spent about 200 ms there (PJRT CPU) against 24 ms for the whole backward pass
of a hand-written loop. The kernel here builds the same value as the concatenation of the base's
slices before and after the updated range with `src` between them: XLA folds a slice of a
concatenation into the operand it selects, so a chain of updates becomes one concatenation of
the gradients, one pass over the bucket. The values are identical (a copy, no arithmetic);
strided slices (`step > 1`) go through `index_copy`.

In bf16 and fp16 the concatenation runs on the bits (bitcast to s16 and back, one XLA computation
per update): XLA's CPU compiler widens 16-bit floating-point data movement to f32 before it folds
slices of concatenations, and the f32->bf16->f32 round trips it leaves between updates keep every
update a pass over the whole buffer (DeepSpeed's bf16 ZeRO-1 step of a 4.2M-parameter MLP: 15 such
passes in one graph). XLA folds a pair of bitcasts and leaves integers alone, so the bf16 chain
becomes one concatenation, as in fp32.

Batch normalization in training (`torch.nn.functional.batch_norm`, which every `nn.BatchNorm*d`
calls) normalizes with the batch's biased variance and, in PyTorch, blends the unbiased one
(n / (n - 1) times it, n values per channel) into `running_var`. torch_xla 2.9's
`native_batch_norm` blends the biased one: running statistics drift from CPU and CUDA's by that
factor each step, and eval-mode outputs differ (a BatchNorm1d over batches of 8: 1-2% in eval
loss after a few epochs, training losses equal). The wrapper leaves the forward to torch_xla and
rescales only the variance's share of the blend, on XLA tensors in training, in eager mode. Under
`torch.compile` (`openxla`) the graph is built from PyTorch's own decomposition of batch normalization,
which blends the unbiased variance already: there the rescaling would count it twice.

A host tensor made from an XLA tensor's metadata (`torch.empty_like(x, device="cpu")`,
`x.new_empty(shape, device="cpu")`, `zeros_like`, `full_like`, ...) came back from torch 2.9's
functionalization layer, which every XLA tensor passes through, wrapped as a functional tensor around
the real host tensor: its values read, but it has no storage (`data_ptr()` 0), so `torch.save` failed
("invalid python storage") and so did pinning it. DeepSpeed allocates host buffers that way
(`offload_states`' pinned buffers, `offload_adam_states`, AutoTP's host copies). Kernels on the
Functionalize key for these factory ops do what PyTorch's generated ones do (unwrap the input,
call the op below that key, wrap the result) except that a result on another device comes back as
it is: a plain host tensor, as from a CUDA tensor.

`replace_xla_kernels` is how deepspeed_xla puts any kernel of its own on the XLA dispatch key
(step_graphs.py's host read too).
"""

import functools
import warnings

import torch

from xla_host.import_hooks import wrap_once

from . import DEVICE_TYPE

# XLA's integer type of the same width, for moving 16-bit floating-point values as bits.
_BITS_TYPES = {torch.bfloat16: ("bf16", "s16"), torch.float16: ("f16", "s16")}
_bits_slice_scatter = None  # the registered XLA computation, made on first use

_library = None  # the one torch.library registration of deepspeed_xla's kernels
_replaced = set()  # (aten op name, dispatch key) pairs registered there

# Factory ops that take their metadata from a tensor and a device from the caller: aten's schemas with a
# `Tensor self` first and a `Device? device` argument, less conversions (`to`, `_to_copy`: torch_xla's own
# kernels copy to the host), sparse constructors (XLA has no sparse tensors) and `new_empty_strided`, whose
# host result torch_xla 2.9 refuses below this key (an internal assertion, with or without this kernel).
_LIKE_FACTORIES = ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
                   "randint_like", "randint_like.low_dtype", "randint_like.Tensor", "new_empty", "new_zeros",
                   "new_ones", "new_full")
_FUNCTIONALIZE = torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)


def _reduce_all(reduce_dim):

    def kernel(x, dim=(), keepdim=False):
        if x.dim() == 0:
            return x.clone()
        dims = sorted({d % x.dim() for d in dim} if dim else range(x.dim()), reverse=True)
        out, has_nan = x, x.isnan() if x.is_floating_point() else None
        for d in dims:
            out = reduce_dim(out, d, True)[0]
            has_nan = has_nan.any(d, keepdim=True) if has_nan is not None else None
        if has_nan is not None:
            out = torch.where(has_nan, torch.full_like(out, float("nan")), out)
        if not keepdim:
            out = out.reshape([size for i, size in enumerate(out.shape) if i not in dims])
        return out

    return kernel


def _slice_scatter(base, src, dim=0, start=None, end=None, step=1):
    # aten's slice semantics: negative bounds count from the end, bounds clamp to [0, size]. The
    # base's parts are taken with slice_copy, not narrow: a base that is itself a view of another
    # tensor reaches this kernel with a storage offset that views taken here would ignore.
    dim = dim % base.dim()
    size = base.shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    start, end = min(max(start, 0), size), min(max(end, start, 0), size)
    shape = list(base.shape)
    shape[dim] = len(range(start, end, step))
    if list(src.shape) != shape:
        raise RuntimeError(f"slice_scatter: expected src of shape {shape} for the slice, got {list(src.shape)}")
    src = src.to(base.dtype)
    if step != 1:
        return base.index_copy(dim, torch.arange(start, end, step, device=base.device), src)
    if start == end:
        return base.clone()
    if base.dtype in _BITS_TYPES:
        return _slice_scatter_as_bits(base, src, dim=dim, start=start, end=end)
    parts = [torch.ops.aten.slice_copy.Tensor(base, dim, 0, start)] if start else []
    parts.append(src)
    if end < size:
        parts.append(torch.ops.aten.slice_copy.Tensor(base, dim, end, size))
    return torch.cat(parts, dim) if len(parts) > 1 else src.clone()


def _slice_scatter_as_bits(base, src, dim, start, end):
    """`base` with `src` in [start, end) of `dim` (both 16-bit floats of one dtype), concatenated as integers."""
    global _bits_slice_scatter
    if _bits_slice_scatter is None:
        import torch_xla.core.xla_builder as xb
        import torch_xla.core.xla_op_registry as xor

        def lowering(base, src, dim, start, end, float_type, bits_type):
            bits = base.bitcast(bits_type)
            size = base.shape().sizes[dim]
            parts = [bits.slice_in_dim(0, start, dim)] if start else []
            parts.append(src.bitcast(bits_type))
            if end < size:
                parts.append(bits.slice_in_dim(end, size, dim))
            return xb.Op.concat_in_dim(parts, dim).bitcast(float_type)

        _bits_slice_scatter = xor.register("deepspeed_xla_slice_scatter_bits", lowering)
    float_type, bits_type = _BITS_TYPES[base.dtype]
    return _bits_slice_scatter(base, src, dim=dim, start=start, end=end, float_type=float_type, bits_type=bits_type)


def _running_var_unbiased(batch_norm):

    @functools.wraps(batch_norm)
    def wrapper(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        # Under torch.compile PyTorch's decomposition of the op already blends the unbiased variance.
        if torch.compiler.is_compiling() or not (
                training and running_var is not None and momentum and input.device.type == DEVICE_TYPE):
            return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
        kept = (1 - momentum) * running_var.detach()
        out = batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
        n = input.numel() // input.size(1)  # values per channel; F.batch_norm refuses n == 1 in training
        # Through .data: autograd saved running_var at the version the op left it (its backward in training
        # reads only the batch statistics), so this write must not count as a change of it.
        running_var.data.copy_(kept + (running_var.detach() - kept) * (n / (n - 1)))
        return out

    return wrapper


def _host_results_unwrapped(op):
    """A Functionalize-key kernel for the factory `op` (an OpOverload): its result is wrapped as PyTorch's
    generated kernel wraps it, unless it was made from an XLA tensor for another device (the host)."""

    def kernel(*args, **kwargs):
        args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _unwrapped, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_FUNCTIONALIZE):
            out = op(*args, **kwargs)
        # Functionalization of other devices' programs (torch.func.functionalize, torch.compile) is left as it was.
        if args[0].device.type == DEVICE_TYPE and out.device.type != DEVICE_TYPE:
            return out
        return torch._to_functional_tensor(out)

    return kernel


def _unwrapped(tensor):
    return torch._from_functional_tensor(tensor) if torch._is_functional_tensor(tensor) else tensor


def _overload(name):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def replace_xla_kernels(kernels, dispatch_key="XLA"):
    """Register `kernels` ({aten op name: kernel}) for `dispatch_key` (XLA unless named) in place of the
    registered ones; an op already registered here for that key is left as it is (each at most once per
    process)."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # PyTorch warns when a kernel for an existing (op, key) pair is replaced: that is the point.
        warnings.simplefilter("ignore")
        for op, kernel in kernels.items():
            if (op, dispatch_key) not in _replaced:
                _library.impl(op, kernel, dispatch_key)
                _replaced.add((op, dispatch_key))


def install():
    """Register the corrected kernels for the XLA dispatch key and the factory ops' kernels for the
    Functionalize key, and correct batch normalization's running variance on XLA (once per process)."""
    replace_xla_kernels({"amax": _reduce_all(torch.ops.aten.max.dim), "amin": _reduce_all(torch.ops.aten.min.dim),
                         "slice_scatter": _slice_scatter})
    replace_xla_kernels({name: _host_results_unwrapped(_overload(name)) for name in _LIKE_FACTORIES},
                        dispatch_key="Functionalize")
    wrap_once(torch.nn.functional, "batch_norm", _running_var_unbiased)
