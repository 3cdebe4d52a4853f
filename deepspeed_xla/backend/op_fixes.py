"""Corrections to PyTorch/XLA operator kernels that DeepSpeed depends on.

torch_xla 2.9 lowers `amax`/`amin` called with the default `dim=()` as "reduce over no
dimension" and returns the input unchanged, where PyTorch reduces over every
dimension. DeepSpeed's overflow check (`has_inf_or_nan`: `isfinite(x.amax())`) then
gets a tensor instead of a scalar and fails in bf16/fp16 training. The corrected
kernels reduce one dimension at a time with `max.dim`/`min.dim`, and put NaN back
where the input had one: XLA's max/min drop NaN, PyTorch's propagate it, and the
overflow check depends on that. Autograd keeps using PyTorch's own derivative formulas,
since these kernels sit below the autograd key.

`replace_xla_kernels` is how deepspeed_xla puts any kernel of its own on the XLA dispatch key
(step_graphs.py's host read too).
"""

import warnings

import torch

_library = None  # the one torch.library registration of deepspeed_xla's XLA kernels
_replaced = set()  # aten op names registered there


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


def replace_xla_kernels(kernels):
    """Register `kernels` ({aten op name: kernel}) for the XLA dispatch key in place of torch_xla's;
    an op already registered here is left as it is (each at most once per process)."""
    global _library
    if _library is None:
        _library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # PyTorch warns when a kernel for an existing (op, key) pair is replaced: that is the point.
        warnings.simplefilter("ignore")
        for op, kernel in kernels.items():
            if op not in _replaced:
                _library.impl(op, kernel, "XLA")
                _replaced.add(op)


def install():
    """Register the corrected kernels for the XLA dispatch key (once per process)."""
    replace_xla_kernels({"amax": _reduce_all(torch.ops.aten.max.dim), "amin": _reduce_all(torch.ops.aten.min.dim)})
