"""What XLA cannot run, refused up front in one line that names the setting and what to use.

Without these, the failure surfaces later and deep inside torch_xla or a compiler (e.g. a
sparse embedding's backward: `NotImplementedError ... 'SparseXLA' backend`).

* `nn.Embedding(..., sparse=True)` / `nn.EmbeddingBag(..., sparse=True)`: XLA has no
  sparse tensors, so such a layer cannot produce its gradient. A forward pass that would
  need one (grad enabled, weight trainable, on XLA) is refused; inference is not.
* `torch.compile` backends that compile for CUDA or the host (inductor, cudagraphs, ...):
  XLA tensors need a backend that hands the graph to XLA (`openxla`) or runs it as traced.
* an fp16 config where the device has no fp16 arithmetic (TPUs, and PJRT CPU standing in for
  them): DeepSpeed refuses it too, with "Type fp16 is not supported on your device.", which
  names neither the device nor what to use; the same refusal here names both (bf16).

A refusal the script does not catch ends the process as any uncaught exception does (exit status
1), printed as its one line without the traceback: the line says all there is to fix, and under
the launcher every rank prints it. Other uncaught exceptions keep Python's report.
"""

import functools
import sys

import torch

from xla_host import discovery
from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import COMPILE_BACKENDS, DEFAULT_COMPILE_BACKEND, DEVICE_TYPE
from . import DEEPSPEED_ENGINE


class UnsupportedOnXla(ValueError):
    """A model or config setting XLA cannot run; the message says what to use instead."""


def _refuse_sparse_training(module, args):
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
        weight = module.weight
        if torch.is_grad_enabled() and weight.requires_grad and weight.device.type == DEVICE_TYPE:
            raise UnsupportedOnXla(
                f"deepspeed_xla: {type(module).__name__}({weight.shape[0]}, {weight.shape[1]}, sparse=True) cannot "
                "train on XLA, which has no sparse gradients; build it with sparse=False (the gradient values are "
                "the same)")


_hook = None


def _refusals_in_one_line(previous):

    def excepthook(kind, value, traceback):
        if issubclass(kind, UnsupportedOnXla):
            print(f"{kind.__name__}: {value}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, traceback)

    return excepthook


def _fp16_refused_naming_bf16(do_sanity_check):
    @functools.wraps(do_sanity_check)
    def wrapper(engine, *args, **kwargs):
        from deepspeed.accelerator import get_accelerator
        if engine.fp16_enabled() and not get_accelerator().is_fp16_supported():
            kind = discovery.device_type()
            device = {"TPU": "a TPU", "CPU": "PJRT CPU (which stands in for a TPU)"}.get(kind, f"an XLA {kind} device")
            raise UnsupportedOnXla(
                f"deepspeed_xla: the config enables fp16, which {device} does not compute (of XLA devices, only GPUs "
                'do); train in bf16 instead: "bf16": {"enabled": true} in place of the "fp16" section (bf16 has '
                "fp32's range, so it needs no loss scaling)")
        return do_sanity_check(engine, *args, **kwargs)

    return wrapper


def _check_engine_configs(engine_module):
    wrap_once(engine_module.DeepSpeedEngine, "_do_sanity_check", _fp16_refused_naming_bf16)


_ENGINE_HOOK = PostImportHook(DEEPSPEED_ENGINE, _check_engine_configs)


def install():
    """Refuse training a sparse embedding on XLA, in every module's forward, and an fp16 config on a device without
    fp16 once DeepSpeed's engine module loads; print an uncaught refusal as its one line (idempotent)."""
    global _hook
    if _hook is None:
        _hook = torch.nn.modules.module.register_module_forward_pre_hook(_refuse_sparse_training)
    wrap_once(sys, "excepthook", _refusals_in_one_line)
    arm(_ENGINE_HOOK)


def check_compile_backend(backend):
    """Raise UnsupportedOnXla unless `backend` compiles graphs of XLA tensors."""
    if backend not in COMPILE_BACKENDS:
        raise UnsupportedOnXla(f"deepspeed_xla: torch.compile backend {backend!r} does not compile XLA tensors; "
                               f"use '{DEFAULT_COMPILE_BACKEND}' (the default on XLA) or one of "
                               f"{', '.join(COMPILE_BACKENDS[1:])}")
