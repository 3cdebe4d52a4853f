"""`XLA_Accelerator`, DeepSpeed's accelerator interface on XLA devices (_xla_accelerator.py).

With DS_ACCELERATOR=xla, DeepSpeed builds its accelerator while DeepSpeed itself is being
imported (_activation.py). A script that imports this module before DeepSpeed would have
DeepSpeed build it from a module still half loaded; DeepSpeed is therefore imported first,
and builds it from _xla_accelerator.py, whatever the order of a script's imports.
"""

# First, as said above; inside DeepSpeed's own import (the usual order) this finds it already loading.
import deepspeed  # noqa: F401

from ._xla_accelerator import XLA_Accelerator

__all__ = ["XLA_Accelerator"]
