"""Every op builder DeepSpeed knows, as XLA provides it.

DeepSpeed builds its op list (`deepspeed.ops.__compatible_ops__`, `ds_report`) from the
`...Builder` members of the modules in the accelerator's `op_builder_dir()`. This module
gives it one member per builder class DeepSpeed defines, resolved by the rule in
`builder.py`: torch-native (compatible), DeepSpeed's host-side CPU builders (their own
compatibility), or not available on XLA (incompatible, load() says why).
"""

from .builder import builder_class_names, get_builder_class

globals().update({name: get_builder_class(name) for name in builder_class_names()})
