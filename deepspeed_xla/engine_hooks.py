"""What deepspeed_xla adapts on DeepSpeed's engine class, applied once its module loads.

One post-import hook per module: bucket sizes bounded by the model (bucket_sizes.py), a graph
cut at the end of backward and step (step_graphs.py), and tied parameters told by identity
where data_ptr() tells nothing (checkpointing.py). DeepSpeed's files are not touched.
"""

from . import bucket_sizes, checkpointing, step_graphs
from .import_hooks import PostImportHook, arm as arm_hook

ENGINE_MODULE = "deepspeed.runtime.engine"


def _install(engine_module):
    bucket_sizes.install(engine_module)
    step_graphs.install(engine_module)
    checkpointing.install_shared_params(engine_module)


_HOOK = PostImportHook(ENGINE_MODULE, _install)


def arm():
    """Adapt the engine as soon as DeepSpeed's engine module loads (or now, if it has)."""
    arm_hook(_HOOK)
