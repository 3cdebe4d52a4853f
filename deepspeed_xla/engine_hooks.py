"""What deepspeed_xla adapts on DeepSpeed's engine class, applied once its module loads.

One post-import hook per module: ZeRO buffers sized and laid out for XLA (zero_buffers.py), ZeRO's
parameters kept as the views made with their flat buffer (ZeRO-1/2 and 3, zero_param_views.py), a graph
cut at the end of backward and step (step_graphs.py), and tied parameters told by identity
where data_ptr() tells nothing (checkpointing.py), and an fp16 config refused naming bf16 where the device has no
fp16 (xla_limits.py). DeepSpeed's files are not touched.
"""

from . import checkpointing, step_graphs, xla_limits, zero_buffers, zero_param_views
from xla_host.import_hooks import PostImportHook
from xla_host.import_hooks import arm as arm_hook

ENGINE_MODULE = "deepspeed.runtime.engine"


def _install(engine_module):
    zero_buffers.install(engine_module)
    zero_param_views.install(engine_module)
    step_graphs.install(engine_module)
    checkpointing.install_shared_params(engine_module)
    xla_limits.install_engine_checks(engine_module)


_HOOK = PostImportHook(ENGINE_MODULE, _install)


def arm():
    """Adapt the engine as soon as DeepSpeed's engine module loads (or now, if it has)."""
    arm_hook(_HOOK)
