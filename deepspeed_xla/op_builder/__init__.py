"""Op builders for XLA: the rule that decides what DeepSpeed gets when it asks for a kernel.

XLA compiles whole graphs from torch ops, so there is nothing to build:
1. Kernels DeepSpeed's on-device optimizers load (FusedAdam, FusedLamb, FusedLion) are
   torch-native implementations of the same update (`torch_native.py`), traced into the
   step graph like any other op. Configs naming Adam/AdamW/Lamb/Lion therefore run on XLA
   without compiling anything, and compute what the CUDA kernels compute.
2. Host-side kernels (CPU Adam/Adagrad/Lion for optimizer offload, async I/O, pinned
   memory) work on host tensors: DeepSpeed's own CPU builders serve them unchanged.
3. Everything else (CUDA-only kernels: transformer inference, quantizers, ...) gets a
   builder that reports itself incompatible and whose load() says why, by name.
"""

from deepspeed.ops.op_builder.builder import OpBuilder

from . import torch_native


class TorchNativeBuilder(OpBuilder):
    """Builds nothing: load() returns a module of torch ops with the kernel's API."""

    def __init__(self):
        super().__init__(name=self.NAME)

    def absolute_name(self):
        return f"deepspeed_xla.op_builder.torch_native.{self.NAME}"

    def sources(self):
        return []

    def is_compatible(self, verbose=False):
        return True

    def load(self, verbose=True):
        return self.MODULE


class FusedAdamBuilder(TorchNativeBuilder):
    BUILD_VAR = "DS_BUILD_FUSED_ADAM"
    NAME = "fused_adam"
    MODULE = torch_native.fused_adam


class FusedLionBuilder(TorchNativeBuilder):
    BUILD_VAR = "DS_BUILD_FUSED_LION"
    NAME = "fused_lion"
    MODULE = torch_native.fused_lion


class FusedLambBuilder(TorchNativeBuilder):
    BUILD_VAR = "DS_BUILD_FUSED_LAMB"
    NAME = "fused_lamb"
    MODULE = torch_native.fused_lamb


class NotAvailableOnXlaBuilder(OpBuilder):
    """A CUDA-only kernel: incompatible, and load() names it."""
    BUILD_VAR = "DS_BUILD_NOT_AVAILABLE_ON_XLA"
    NAME = "unnamed op"

    def __init__(self):
        super().__init__(name=self.NAME)

    def absolute_name(self):
        return f"deepspeed_xla.op_builder.{self.name}"

    def sources(self):
        return []

    def is_compatible(self, verbose=False):
        return False

    def load(self, verbose=True):
        raise RuntimeError(f"DeepSpeed op '{self.name}' has no XLA implementation: it is a CUDA kernel. "
                           "Use a config that does not need it (e.g. a torch optimizer) on XLA devices.")


_TORCH_NATIVE = {cls.__name__: cls for cls in (FusedAdamBuilder, FusedLambBuilder, FusedLionBuilder)}
_HOST_SIDE = ("CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder", "AsyncIOBuilder", "PinMemoryBuilder")


def get_builder_class(class_name):
    """The builder class DeepSpeed gets for `class_name` on XLA (see the module rule)."""
    if class_name in _TORCH_NATIVE:
        return _TORCH_NATIVE[class_name]
    if class_name in _HOST_SIDE:
        from deepspeed.ops.op_builder import cpu
        return getattr(cpu, class_name)
    op_name = class_name[:-len("Builder")] if class_name.endswith("Builder") else class_name
    return type(class_name, (NotAvailableOnXlaBuilder, ), {"NAME": op_name})
