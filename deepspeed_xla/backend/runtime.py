"""Every runtime call into torch_xla: devices, graphs, host transfers, RNG, memory, collectives.

The rest of the package (accelerator, streams, communication backend) talks to this module
only; docs/backends.md maps each function onto what a second TPU backend would supply.
Device kind and count, which the launcher parent needs without starting the runtime, are
in xla_host.discovery.

Importing this module does not import torch_xla; its first use does. DeepSpeed's launcher
processes (the `deepspeed` runner and launch.py) load the accelerator, never touch a device,
and so never pay torch_xla's import (about 3 s each, before any worker starts). Workers import
torch_xla up front (`backend.load()`).
"""

import functools
import importlib
import importlib.util
import os
import time

import torch
from torch.utils.dlpack import from_dlpack as torch_from_dlpack


class _ImportedOnFirstUse:
    """Stands for a torch_xla module until an attribute is asked for; then imports the module and
    puts it in its place in this module's globals, so later calls use it directly."""

    def __init__(self, alias, name):
        self._alias, self._name = alias, name

    def __getattr__(self, attribute):
        module = importlib.import_module(self._name)
        globals()[self._alias] = module
        return getattr(module, attribute)


torch_xla = _ImportedOnFirstUse("torch_xla", "torch_xla")
xm = _ImportedOnFirstUse("xm", "torch_xla.core.xla_model")
xla_dlpack = _ImportedOnFirstUse("xla_dlpack", "torch_xla.utils.dlpack")


def is_initialized():
    """True once this process has created its PJRT client (and owns its devices)."""
    return torch_xla._XLAC._xla_runtime_is_initialized()


def start():
    """Start this process's XLA runtime (a no-op once started); it then owns its devices."""
    torch_xla.device()


def torch_device(ordinal=None):
    """The torch.device of a local XLA ordinal; None means the process default."""
    if ordinal is None:
        return torch_xla.device()
    return torch.device("xla", ordinal)


def sync(wait=True):
    """Cut and execute the pending lazy graph; with wait, block until the device is idle.

    DeepSpeed synchronizes from inside module hooks (timers in the forward pre-hook),
    where PyTorch/XLA's IR scope is not empty: the scope is left alone, not reset.
    """
    torch_xla.sync(wait=wait, reset_scope=False)
    if wait:
        xm.wait_device_ops()


def is_pending(tensor):
    """Whether XLA `tensor` (its functionalized value, for a functional tensor) is a computation not yet run,
    which the next sync computes and writes out, rather than a device buffer."""
    if torch._is_functional_tensor(tensor):
        tensor = torch._from_functional_tensor(tensor)
    return "\nXLAData: None\n" in torch_xla._XLAC._get_xla_tensor_debug_info(tensor)


@functools.cache
def _buffers_are_host_memory(device):
    return xm.xla_device_hw(device) == "CPU"


def to_host(tensor, *, read_only=False, out=None):
    """A contiguous CPU tensor with the value of XLA `tensor` (any shape, dtype, view), computing
    only what it needs, as `tensor.cpu()` does. On PJRT CPU, whose device buffers are host memory,
    the value is copied once out of the materialised buffer (DLPack), where a transfer through
    XLA's literal path copies it twice (16 MB: about 7 against 20 ms).

    read_only: the caller only reads the result and drops it before anything else runs on the
    device (a collective's operand); on PJRT CPU it is then the device buffer itself, no copy.
    Writing to it would change every tensor that shares the buffer.
    out: a contiguous CPU tensor of `tensor`'s shape and dtype to copy the value into and return
    (a reused staging buffer), instead of a new one."""
    if not _buffers_are_host_memory(tensor.device):
        return tensor.cpu().contiguous() if out is None else out.copy_(tensor)
    torch_xla._XLAC._xla_sync_multi([tensor], [], True)
    xm.wait_device_ops()  # the buffer may still be written by an earlier asynchronous execution
    view = torch_from_dlpack(xla_dlpack.to_dlpack(tensor))
    stored_as_typed = view.dtype == tensor.dtype  # not under XLA_USE_BF16 and the like
    if out is not None:
        return out.copy_(view if stored_as_typed else tensor)
    if not stored_as_typed:
        return tensor.cpu().contiguous()
    if read_only and view.is_contiguous():
        return view
    return view.clone(memory_format=torch.contiguous_format)


def to_device(host, device):
    """An XLA tensor on `device` with the value of CPU tensor `host`, as `host.to(device)`; `host` stays the
    caller's to change. On PJRT CPU the device buffer is a copy of `host` that torch makes in C++ and XLA adopts
    through DLPack (one copy, where XLA's literal path copies twice).

    Why a copy made in C++, never `host` itself or a copy made from Python: XLA releases device buffers on its own
    threads (when an asynchronous execution that used one ends). A buffer adopted from a tensor that Python has
    seen keeps that tensor's Python object alive (PyTorch hands the object to the C++ tensor while C++ holds it),
    so its release must take the GIL; the main thread holds the GIL while it waits for the device (torch_xla's
    exit handler does), and neither could go on: a run that trained to the end and never exited. A tensor made
    in C++ has no Python object, and XLA frees it without the GIL."""
    if not _buffers_are_host_memory(device) or torch.device(device) != torch_xla.device():
        return host.to(device)  # DLPack lands on the process's default device
    if not host.is_contiguous():
        host = host.contiguous()  # a Python-side temporary; XLA still gets the C++ copy of it
    return torch_xla._XLAC._from_dlpack(torch._C._to_dlpack(host, copy=True))


def get_rng_seed(device):
    """The XLA generator's running seed: the whole RNG state of that device."""
    return int(xm.get_rng_state(str(device)))


def set_rng_seed(seed, device):
    """Set the running seed, and with it the base seed (torch_xla sets both)."""
    xm.set_rng_state(int(seed), str(device))


def get_rng_base_seed(device):
    """The base seed of the current step: torch_xla derives the next step's from it at each sync,
    whatever the running seed is then (one scalar read from the device). torch_xla rewinds the
    running seed to the base when it hands the base out: read the running seed first."""
    return int(torch_xla._XLAC._get_base_seed_as_tensor(str(device)).item()) & _SEED_MASK


_SEED_MASK = (1 << 64) - 1


def next_step_seed(base_seed):
    """The base (and running) seed torch_xla 2.9 sets at a sync that ends a step with `base_seed`."""
    return (1012031 + base_seed * 7012063) & _SEED_MASK


def after_next_sync(callback):
    """Run `callback()` once, right after the next sync (`torch_xla.sync`/`xm.mark_step`) has run."""
    xm.add_step_closure(callback)


MATMUL_PRECISION_ENV = "DS_XLA_MATMUL_PRECISION"


def apply_matmul_precision(environ=os.environ):
    """Set torch_xla's fp32 matmul/convolution precision from DS_XLA_MATMUL_PRECISION
    (default | high | highest); unset leaves torch_xla's default (on TPU: bf16 passes)."""
    precision = environ.get(MATMUL_PRECISION_ENV, "").strip().lower()
    if not precision:
        return None
    if precision not in ("default", "high", "highest"):
        raise ValueError(f"{MATMUL_PRECISION_ENV}={precision!r}: expected default, high or highest")
    import torch_xla.backends
    if torch_xla.backends.get_mat_mul_precision() != precision:
        torch_xla._XLAC._xla_set_mat_mul_precision(precision)  # the public setter also logs a warning
    return precision


def memory_info(device):
    """{'bytes_used', 'bytes_limit', 'peak_bytes_used'} from the device allocator, or
    None where the backend keeps no allocator statistics (PJRT CPU)."""
    try:
        return xm.get_memory_info(device)
    except RuntimeError as err:
        if "UNIMPLEMENTED" in str(err):
            return None
        raise


def supports_fp16(device_kind):
    """Only XLA GPUs compute fp16 natively. TPUs have no fp16 arithmetic (their
    low-precision type is bf16) and PJRT CPU emulates it through fp32, so DeepSpeed's
    fp16 mode (loss scaling tuned for CUDA) is not offered there."""
    return device_kind in ("GPU", "CUDA")


def trace_range(name):
    """A named profiler range, as a context manager (shows in XLA profiles; costs little when not tracing)."""
    if _jax_installed():
        import torch_xla.debug.profiler as xp
        return xp.Trace(name)  # also opens JAX's named scope, for torchax lowering
    return _ProfilerRange(name)


@functools.cache
def _jax_installed():
    return importlib.util.find_spec("jax") is not None


class _ProfilerRange:
    """torch_xla.debug.profiler.Trace without its JAX scope: Trace tries `import jax` at every entry, a scan of
    sys.path when JAX is absent (about 1 ms), and ZeRO-3 opens a hundred ranges per step."""

    def __init__(self, name):
        self._name = name

    def __enter__(self):
        self._scope = torch_xla._XLAC.profiler.scope_pusher(self._name)
        self._trace = torch_xla._XLAC.profiler.TraceMe(self._name)
        self._trace.__enter__()
        return self

    def __exit__(self, *exc_info):
        del self._scope
        self._trace.__exit__(*exc_info)


def now():
    """Host timestamp (seconds) for event timing after a device sync."""
    return time.perf_counter()


# -- Collectives of the native transport (comm/native.py) ----------------------------
# Each traces an XLA collective into the pending graph of the participating processes;
# `groups` are replica groups of global ranks covering the whole world.
# ReduceOp name -> the name of torch_xla's reduce type constant (xla_model.REDUCE_*)
REDUCE_KINDS = {"SUM": "REDUCE_SUM", "PRODUCT": "REDUCE_MUL", "MIN": "REDUCE_MIN", "MAX": "REDUCE_MAX",
                "BAND": "REDUCE_AND", "BOR": "REDUCE_OR"}


def all_reduce(kind, tensor, groups, scale=1.0):
    """The reduction of `tensor` over its replica group, as a new tensor (kind: REDUCE_KINDS key)."""
    return xm.all_reduce(getattr(xm, REDUCE_KINDS[kind]), tensor, scale=scale, groups=groups, pin_layout=False)


def all_gather(tensor, groups):
    """The group members' `tensor`s concatenated along dim 0, in group order."""
    return xm.all_gather(tensor, dim=0, groups=groups, pin_layout=False)


def reduce_scatter(kind, tensor, shard_count, groups, scale=1.0):
    """This rank's dim-0 shard of the reduction of `tensor` over its replica group."""
    return xm.reduce_scatter(getattr(xm, REDUCE_KINDS[kind]), tensor, scale=scale, scatter_dim=0, shard_count=shard_count,
                             groups=groups, pin_layout=False)


def all_to_all(tensor, split_count, groups):
    """Dim-0 chunk j of `tensor` to group member j; the received chunks concatenated in order."""
    return xm.all_to_all(tensor, 0, 0, split_count, groups=groups, pin_layout=False)


def collective_permute(tensor, pairs):
    """`tensor` moved along (source, target) global-rank pairs; both ends must trace it."""
    return xm.collective_permute(tensor, pairs=pairs)


def traced_hlo(tensors):
    """The HLO module that computes `tensors` (what the lowering checks inspect)."""
    return torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))
