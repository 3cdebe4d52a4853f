"""The XLA backend: everything of deepspeed_xla that is specific to torch_xla (PyTorch/XLA 2.9).

* runtime.py: every runtime call into torch_xla (devices, graphs, transfers, RNG, memory,
  collectives);
* op_fixes.py: kernels of deepspeed_xla's own on torch_xla's dispatch key;
* pjrt_env.py: the per-process PJRT/TPU environment a launcher worker needs before the runtime
  starts (no torch_xla import);
* host_memory.py: on PJRT CPU, freed device buffers stay with the process instead of being
  faulted in again every step;
* core_binding.py: on PJRT CPU, each local rank runs on its own share of the host's cores;
* cpu_compile.py: on PJRT CPU, XLA compiles graphs quickly rather than optimizing their kernels;
* the names below: torch_xla's device type, dispatch key and torch.compile backends.

docs/backends.md maps each piece onto what a second TPU backend (TorchTPU) would supply.
Importing this package or runtime.py does not import torch_xla; `load()` and the first runtime call do.
"""

DEVICE_TYPE = "xla"  # torch.device("xla", n)
DISPATCH_KEY = "XLA"
DEFAULT_COMPILE_BACKEND = "openxla"  # torch.compile's backend that hands the graph to XLA
COMPILE_BACKENDS = (DEFAULT_COMPILE_BACKEND, "openxla_eval", "eager", "aot_eager")
INSTALL_HINT = ("deepspeed_xla: DS_ACCELERATOR=xla needs torch_xla, which is not installed. "
                "Install it with `pip install deepspeed-xla[tpu]` on a TPU VM, or `pip install torch_xla==2.9.0` "
                "for PJRT CPU, or unset DS_ACCELERATOR.")


def load():
    """Import torch_xla, which registers the `xla` device with torch; a worker must do so before
    DeepSpeed touches a device, after the host allocator is set up, the rank bound to its cores and XLA told to
    compile quickly for PJRT CPU (host_memory.py, core_binding.py, cpu_compile.py). SystemExit with INSTALL_HINT
    when torch_xla is not installed; ValueError for a bad DS_XLA_CPU_MALLOC or DS_XLA_BIND_CORES."""
    from . import core_binding, cpu_compile, host_memory
    host_memory.keep_freed_memory()
    core_binding.bind_local_rank()
    cpu_compile.compile_quickly()
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
