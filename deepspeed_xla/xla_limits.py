"""What XLA cannot run, refused up front in one line that names the setting and what to use.

Without these, the failure surfaces later and deep inside torch_xla or a compiler (e.g. a
sparse embedding's backward: `NotImplementedError ... 'SparseXLA' backend`).

* `nn.Embedding(..., sparse=True)` / `nn.EmbeddingBag(..., sparse=True)`: XLA has no
  sparse tensors, so such a layer cannot produce its gradient. A forward pass that would
  need one (grad enabled, weight trainable, on XLA) is refused; inference is not.
* `torch.compile` backends that compile for CUDA or the host (inductor, cudagraphs, ...):
  XLA tensors need a backend that hands the graph to XLA (`openxla`) or runs it as traced.
"""

import torch

from .backend import COMPILE_BACKENDS, DEFAULT_COMPILE_BACKEND, DEVICE_TYPE


class UnsupportedOnXla(ValueError):
    """A model or config setting XLA cannot run; the message says what to use instead."""


def _refuse_sparse_training(module, args):
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
        weight = module.weight
        if torch.is_grad_enabled() and weight.requires_grad and weight.device.type == DEVICE_TYPE:
            raise UnsupportedOnXla(
                f"deepspeed_xla: {type(module).__name__}({weight.shape[0]}, {weight.shape[1]}, sparse=True) cannot "
                "train on XLA, which has no sparse gradients; build it with sparse=False (the gradient values are "
                "the same) and leave DeepSpeed's `sparse_gradients` off")


_hook = None


def install():
    """Refuse training a sparse embedding on XLA, in every module's forward (idempotent)."""
    global _hook
    if _hook is None:
        _hook = torch.nn.modules.module.register_module_forward_pre_hook(_refuse_sparse_training)


def check_compile_backend(backend):
    """Raise UnsupportedOnXla unless `backend` compiles graphs of XLA tensors."""
    if backend not in COMPILE_BACKENDS:
        raise UnsupportedOnXla(f"deepspeed_xla: torch.compile backend {backend!r} does not compile XLA tensors; "
                               f"use '{DEFAULT_COMPILE_BACKEND}' (the default on XLA) or one of "
                               f"{', '.join(COMPILE_BACKENDS[1:])}")
