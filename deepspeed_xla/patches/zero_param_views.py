"""ZeRO's parameters on XLA: views of the flat parameter buffer, made when the buffer is, not every step.

DeepSpeed's ZeRO optimizers keep each parameter group as one flat buffer and each parameter (ZeRO-1/2)
or each parameter's partition (ZeRO-3, `ds_tensor`) as a view into it. A step updates the buffer in
place (the optimizer's fp32 partition copied in; ZeRO-1/2 then all-gather it across ranks), and then
points every parameter at a new view of the same buffer (ZeRO-1/2: `_update_model_bit16_weights`,
which DeepSpeed's source marks as probably not needed; ZeRO-3: `_unflatten_partitioned_parameters`).
On CUDA a view costs nothing. On XLA a view made inside the traced step is a pending value of its
own, so the step's graph wrote every parameter out as a buffer of its own: a second copy of the
model (or of this rank's partition) in device memory, written once more per step (a 4.2M-parameter
MLP: 8 more outputs, 16 MB per step).

The views made when the buffer was made already follow its in-place updates (PyTorch/XLA's
functionalization recomputes a view from its base when the view is next read), so on XLA these
calls are skipped inside `step()`. Their other callers still run them: initialisation, checkpoint
loading, and DeepSpeed's `offload_states`/`reload_states`, which move the buffer to another device and
so need new views. `install()` wraps the methods once DeepSpeed's engine module loads;
DeepSpeed's files are not touched.
"""

import functools

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE
from . import DEEPSPEED_ENGINE

_IN_STEP = "_deepspeed_xla_in_step"


def _marks_its_step(step):
    @functools.wraps(step)
    def wrapper(optimizer, *args, **kwargs):
        setattr(optimizer, _IN_STEP, True)
        try:
            return step(optimizer, *args, **kwargs)
        finally:
            setattr(optimizer, _IN_STEP, False)

    return wrapper


def _skipped_in_step_on_xla(flat_buffers):
    """Wrap a method(optimizer, group_index) that re-points a group's parameters at views of
    `flat_buffers(optimizer)[group_index]`: skipped inside step() where that buffer is on XLA."""
    def wrap(repoint):
        @functools.wraps(repoint)
        def wrapper(optimizer, group_index):
            if getattr(optimizer, _IN_STEP, False) and flat_buffers(optimizer)[group_index].device.type == DEVICE_TYPE:
                return None
            return repoint(optimizer, group_index)

        return wrapper

    return wrap


def _patch(engine_module):
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    for optimizer, repoint, flat_buffers in (
            (DeepSpeedZeroOptimizer, "_update_model_bit16_weights", lambda optimizer: optimizer.bit16_groups_flat),
            (DeepSpeedZeroOptimizer_Stage3, "_unflatten_partitioned_parameters",
             lambda optimizer: optimizer.fp16_partitioned_groups_flat)):
        wrap_once(optimizer, "step", _marks_its_step)
        wrap_once(optimizer, repoint, _skipped_in_step_on_xla(flat_buffers))


_HOOK = PostImportHook(DEEPSPEED_ENGINE, _patch)


def install():
    """Keep ZeRO's parameters as the views made with their flat buffer on XLA, once DeepSpeed's engine module
    loads (idempotent)."""
    arm(_HOOK)
