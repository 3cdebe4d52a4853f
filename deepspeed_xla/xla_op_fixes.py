"""Corrections to PyTorch/XLA operator kernels that DeepSpeed depends on.

torch_xla 2.9 lowers `amax`/`amin` called with the default `dim=()` as "reduce over no
dimension" and returns the input unchanged, where PyTorch reduces over every
dimension. DeepSpeed's overflow check (`has_inf_or_nan`: `isfinite(x.amax())`) then
gets a tensor instead of a scalar and fails in bf16/fp16 training. The corrected
kernels reduce one dimension at a time with `max.dim`/`min.dim` (which propagate NaN
like PyTorch); autograd keeps using PyTorch's own derivative formulas, since these
kernels sit below the autograd key.
"""

import warnings

import torch

_library = None


def _reduce_all(reduce_dim):

    def kernel(x, dim=(), keepdim=False):
        if x.dim() == 0:
            return x.clone()
        dims = sorted({d % x.dim() for d in dim} if dim else range(x.dim()), reverse=True)
        out = x
        for d in dims:
            out = reduce_dim(out, d, True)[0]
        if not keepdim:
            out = out.reshape([size for i, size in enumerate(out.shape) if i not in dims])
        return out

    return kernel


def install():
    """Register the corrected kernels for the XLA dispatch key (once per process)."""
    global _library
    if _library is not None:
        return
    _library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # PyTorch warns when a kernel for an existing (op, key) pair is replaced: that is the point.
        warnings.simplefilter("ignore")
        _library.impl("amax", _reduce_all(torch.ops.aten.max.dim), "XLA")
        _library.impl("amin", _reduce_all(torch.ops.aten.min.dim), "XLA")
