"""The XLA runtime starts before the process's first backward pass.

PyTorch's autograd engine sizes its per-device work queues once, at the first backward
pass of the process, from the device counts known then. The XLA device reports none
until the XLA runtime has started, so a script that runs any backward pass on the CPU
first (a sanity check, a warm-up, a library doing so on import) and trains on XLA later
fails every XLA backward with an INTERNAL ASSERT on `device_ready_queues_`.

The runtime cannot simply start when DeepSpeed loads: the `deepspeed` launcher parent
loads DeepSpeed too, and on a TPU host the process that starts the runtime owns the
chips its workers need. So `install()` puts a one-shot wrapper around autograd's engine
(`Variable._execution_engine`, through which `Tensor.backward`, `torch.autograd.backward`
and `torch.autograd.grad` all run): the first backward pass of the process starts the
runtime, puts the engine back, and proceeds. Launchers never run a backward pass.
"""

from torch.autograd.variable import Variable


class _StartRuntimeFirst:
    """Stands in for autograd's engine until the first backward pass."""

    def __init__(self, engine):
        self._engine = engine

    def run_backward(self, *args, **kwargs):
        Variable._execution_engine = self._engine
        from .backend import runtime
        try:
            runtime.start()
        except ImportError:  # no torch_xla: nothing to start (DeepSpeed's import will say so)
            pass
        return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def install():
    """Start the runtime at the next backward pass of this process (idempotent). Too late
    once a backward pass has run without it: autograd has sized its queues by then."""
    if not pending():
        Variable._execution_engine = _StartRuntimeFirst(Variable._execution_engine)


def pending():
    """True while the runtime waits for the first backward pass to start it."""
    return isinstance(Variable._execution_engine, _StartRuntimeFirst)
