"""ZeRO-1/2's parameters on XLA: views of the flat parameter buffer, made when the buffer is, not every step.

DeepSpeed's ZeRO-1/2 optimizer keeps each parameter group as one flat buffer and each parameter as a
view into it. A step updates the buffer in place (the optimizer's fp32 partition copied in, then
all-gathered across ranks), and then points every parameter at a new view of the same buffer
(`_update_model_bit16_weights`, which DeepSpeed's source marks as probably not needed). On CUDA a
view costs nothing. On XLA a view made inside the traced step is a pending value of its own, so the
step's graph wrote every parameter out as a buffer of its own: a second copy of the model in device
memory, written once more per step (a 4.2M-parameter MLP: 8 more outputs, 16 MB per step).

The views made when the buffer was made already follow its in-place updates (PyTorch/XLA's
functionalization recomputes a view from its base when the view is next read), so on XLA the call at
the end of `step()` is skipped. Its other callers still run it: initialisation, and DeepSpeed's
`offload_states`/`reload_states`, which move the buffer to another device and so need new views.
`install()` wraps the two methods once DeepSpeed's engine module loads (engine_hooks.py);
DeepSpeed's files are not touched.
"""

import functools

from xla_host.import_hooks import wrap_once

from .backend import DEVICE_TYPE

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


def _skipped_in_step_on_xla(update_model_bit16_weights):
    @functools.wraps(update_model_bit16_weights)
    def wrapper(optimizer, group_index):
        if getattr(optimizer, _IN_STEP, False) and optimizer.bit16_groups_flat[group_index].device.type == DEVICE_TYPE:
            return None
        return update_model_bit16_weights(optimizer, group_index)

    return wrapper


def install(engine_module):
    """Keep ZeRO-1/2's parameters as the views made with their flat buffer on XLA (idempotent)."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    wrap_once(DeepSpeedZeroOptimizer, "step", _marks_its_step)
    wrap_once(DeepSpeedZeroOptimizer, "_update_model_bit16_weights", _skipped_in_step_on_xla)
