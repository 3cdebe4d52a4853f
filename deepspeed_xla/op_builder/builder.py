"""Op builders for XLA: the rule that decides what DeepSpeed gets when it asks for a kernel.

XLA compiles whole graphs from torch ops, so there is nothing to build:
1. Kernels DeepSpeed's on-device optimizers load (FusedAdam, FusedLamb, FusedLion) are
   torch-native implementations of the same update (`torch_native.py`), traced into the
   step graph like any other op. Configs naming Adam/AdamW/Lamb/Lion therefore run on XLA
   without compiling anything, and compute what the CUDA kernels compute. ZeRO++'s
   quantizer (`quantizer.py`) is torch-native the same way.
2. Host-side kernels (CPU Adam/Adagrad/Lion for optimizer offload, async I/O, pinned
   memory) work on host tensors: DeepSpeed's own CPU builders serve them unchanged.
3. Everything else (CUDA-only kernels: transformer inference, FP quantizers, ...) gets a
   builder that reports itself incompatible and whose load() says why, by name. It keeps
   the op name DeepSpeed's own builder has ("transformer", "quantizer", ...).

DeepSpeed lists the ops of an accelerator (`deepspeed.ops.__compatible_ops__`, `ds_report`)
from the builder classes in the modules of `op_builder_dir()`: `registry.py` holds one for
every builder DeepSpeed knows.
"""

import functools
import importlib
import os
import pkgutil

from deepspeed.ops.op_builder.builder import OpBuilder

from . import quantizer, torch_native


class _NothingToCompile(OpBuilder):
    """An op builder with no C++/CUDA sources: named by its class's NAME."""

    def __init__(self):
        super().__init__(name=self.NAME)

    def sources(self):
        """[]: no C++/CUDA source files for OpBuilder to compile."""
        return []


class TorchNativeBuilder(_NothingToCompile):
    """Builds nothing: load() returns a module of torch ops with the kernel's API."""

    def absolute_name(self):
        """OpBuilder's import path of the op: here the torch-native module in torch_native.py."""
        return f"deepspeed_xla.op_builder.torch_native.{self.NAME}"

    def is_compatible(self, verbose=False):
        """Always True: torch ops run on any XLA device, so `ds_report` lists the op as compatible."""
        return True

    def load(self, verbose=True):
        """The torch-native module (`MODULE`) with the CUDA kernel's functions; compiles nothing, never raises."""
        return self.MODULE


class FusedAdamBuilder(TorchNativeBuilder):
    """DeepSpeed's FusedAdam kernel (`multi_tensor_adam`, Adam and AdamW) as torch ops, updating in fp32."""
    BUILD_VAR = "DS_BUILD_FUSED_ADAM"
    NAME = "fused_adam"
    MODULE = torch_native.fused_adam


class FusedLionBuilder(TorchNativeBuilder):
    """DeepSpeed's FusedLion kernel (`multi_tensor_lion`) as torch ops, updating in fp32."""
    BUILD_VAR = "DS_BUILD_FUSED_LION"
    NAME = "fused_lion"
    MODULE = torch_native.fused_lion


class FusedLambBuilder(TorchNativeBuilder):
    """DeepSpeed's FusedLamb kernel (`lamb`) as torch ops, updating in fp32."""
    BUILD_VAR = "DS_BUILD_FUSED_LAMB"
    NAME = "fused_lamb"
    MODULE = torch_native.fused_lamb


class QuantizerBuilder(TorchNativeBuilder):
    """DeepSpeed's quantizer kernels for ZeRO++ (quantized weights and gradients) as torch ops (`quantizer.py`)."""
    BUILD_VAR = "DS_BUILD_QUANTIZER"
    NAME = "quantizer"
    MODULE = quantizer

    def absolute_name(self):
        """OpBuilder's import path of the op: the torch-native module quantizer.py."""
        return quantizer.__name__


class NotAvailableOnXlaBuilder(_NothingToCompile):
    """A CUDA-only kernel: incompatible, and load() names it."""
    BUILD_VAR = "DS_BUILD_NOT_AVAILABLE_ON_XLA"
    NAME = "unnamed op"

    def absolute_name(self):
        """OpBuilder's import path of the op, a name only: nothing is importable there."""
        return f"deepspeed_xla.op_builder.{self.name}"

    def is_compatible(self, verbose=False):
        """Always False, so DeepSpeed's `__compatible_ops__` and `ds_report` show the op as unavailable on XLA."""
        return False

    def load(self, verbose=True):
        """Never loads: raises RuntimeError naming the op as a CUDA kernel with no XLA implementation."""
        raise RuntimeError(f"DeepSpeed op '{self.name}' has no XLA implementation: it is a CUDA kernel. "
                           "Use a config that does not need it (e.g. a torch optimizer) on XLA devices.")


_TORCH_NATIVE = {cls.__name__: cls for cls in (FusedAdamBuilder, FusedLambBuilder, FusedLionBuilder, QuantizerBuilder)}
_HOST_SIDE = ("CPUAdamBuilder", "CPUAdagradBuilder", "CPULionBuilder", "AsyncIOBuilder", "PinMemoryBuilder")
_NOT_AVAILABLE = {}


@functools.cache
def deepspeed_builder_classes():
    """{class name: class} of the op builders DeepSpeed itself defines (the modules of its
    `deepspeed/ops/op_builder/`, not its accelerator-specific subpackages); scanned once."""
    import deepspeed.ops.op_builder as package
    found = {}
    for info in pkgutil.iter_modules([os.path.dirname(package.__file__)]):
        if info.ispkg or info.name in ("all_ops", "builder"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if (name.endswith("Builder") and isinstance(value, type) and issubclass(value, OpBuilder)
                    and value.__module__ == module.__name__ and getattr(value, "NAME", None)):
                found[name] = value
    return found


def builder_class_names():
    """Every builder class name DeepSpeed may ask for: its own builders and the host-side ones."""
    return sorted({*deepspeed_builder_classes(), *_HOST_SIDE, *_TORCH_NATIVE})


def _op_name(class_name):
    own = deepspeed_builder_classes().get(class_name)
    if own is not None:
        return own.NAME
    return class_name[:-len("Builder")] if class_name.endswith("Builder") else class_name


def _cpu_builders():
    """DeepSpeed's CPU builder module, chosen as DeepSpeed's own accelerators choose theirs: the top-level
    `op_builder` package where it is DeepSpeed's (a source checkout on sys.path, an editable install), else the
    wheel's `deepspeed.ops.op_builder.cpu`. There, DeepSpeed's CPU builders import the top-level package, whose
    __init__ asks the accelerator for every builder while `deepspeed.ops.op_builder.cpu` is still half imported:
    taking that one fails with a circular import."""
    try:
        from op_builder import __deepspeed__  # noqa: F401
        from op_builder import cpu
    except ImportError:
        from deepspeed.ops.op_builder import cpu
    return cpu


def get_builder_class(class_name):
    """The builder class DeepSpeed gets for `class_name` on XLA (see the module rule)."""
    if class_name in _TORCH_NATIVE:
        return _TORCH_NATIVE[class_name]
    if class_name in _HOST_SIDE:
        return getattr(_cpu_builders(), class_name)
    if class_name not in _NOT_AVAILABLE:
        _NOT_AVAILABLE[class_name] = type(class_name, (NotAvailableOnXlaBuilder, ), {"NAME": _op_name(class_name)})
    return _NOT_AVAILABLE[class_name]
