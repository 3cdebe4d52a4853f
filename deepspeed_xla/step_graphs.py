"""DeepSpeed's optimizer step ends in a graph cut on XLA, and so does a backward pass whose
gradients the step then reads on the host.

XLA runs the traced graph lazily, when a value is read (the loss a script logs, the gradient
-norm and overflow checks of DeepSpeed's ZeRO and mixed-precision optimizers) or at a sync. A
read runs only what that value needs and keeps none of the rest: the next read runs the
shared part again. Under ZeRO-1/2 that shared part copies every gradient into its bucket, so
each of the step's host reads re-ran the whole backward pass. CUDA runs each op once, as it
is issued; the XLA equivalent is to cut the graph where a phase ends, as PyTorch/XLA's own
training loops mark a step after the optimizer step:
  - `engine.step()` ends with a sync (the engine cuts there only from its third step, and only
    through its throughput timer);
  - `engine.backward()` ends with a sync (after DeepSpeed has reduced the gradients) where the
    step reads them on the host first: ZeRO stages 1-3 and bf16/fp16. Plain fp32 ZeRO-0 reads
    nothing, and a cut there would only split one graph in two.
`install()` wraps the two methods of DeepSpeedEngine once DeepSpeed's engine module loads
(engine_hooks.py); DeepSpeed's files are not touched.
"""

import functools

from . import runtime
from .import_hooks import wrap_once


def reads_gradients_in_step(engine):
    """True when the engine's optimizer step reads gradient values on the host before updating."""
    return engine.zero_optimization_stage() > 0 or engine.bfloat16_enabled() or engine.fp16_enabled()


def _always(engine):
    return True


def _ending_in_a_sync(when):

    def wrap(method):

        @functools.wraps(method)
        def wrapper(engine, *args, **kwargs):
            result = method(engine, *args, **kwargs)
            if engine.device.type == "xla" and when(engine):
                runtime.sync(wait=False)
            return result

        return wrapper

    return wrap


def install(engine_module):
    """End DeepSpeedEngine.step, and .backward where the step reads gradients, with a sync (idempotent)."""
    for name, when in (("backward", reads_gradients_in_step), ("step", _always)):
        wrap_once(engine_module.DeepSpeedEngine, name, _ending_in_a_sync(when))
