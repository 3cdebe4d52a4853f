"""Op builders for XLA (builder.py: the rule that decides what DeepSpeed gets when it asks
for a kernel; torch_native.py: the optimizer kernels; quantizer.py: ZeRO++'s quantizer kernels; registry.py: every
builder DeepSpeed knows).

DeepSpeed binds its op builders while it is being imported, asking the accelerator for them
(builder.py). A script that imports this package before DeepSpeed would have DeepSpeed ask
a package still half loaded; DeepSpeed is therefore imported first, whatever the order of a
script's imports.
"""

# First, as said above; inside DeepSpeed's own import (the usual order) this finds it already loading.
import deepspeed  # noqa: F401

from .builder import (FusedAdamBuilder, FusedLambBuilder, FusedLionBuilder, NotAvailableOnXlaBuilder, QuantizerBuilder,
                      TorchNativeBuilder, builder_class_names, deepspeed_builder_classes, get_builder_class)

__all__ = ["FusedAdamBuilder", "FusedLambBuilder", "FusedLionBuilder", "NotAvailableOnXlaBuilder", "QuantizerBuilder",
           "TorchNativeBuilder", "builder_class_names", "deepspeed_builder_classes", "get_builder_class"]
