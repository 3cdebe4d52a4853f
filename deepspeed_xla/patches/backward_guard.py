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
runtime, puts the engine back, and proceeds. Launchers never run a backward pass. It is armed
at interpreter start, before torch loads, and wraps the engine as soon as
`torch.autograd.variable` has loaded: a backward pass before DeepSpeed loads is covered too.
"""

from xla_host.import_hooks import PostImportHook, arm

AUTOGRAD_MODULE = "torch.autograd.variable"  # Variable, whose _execution_engine every backward pass runs on


class _StartRuntimeFirst:
    """Stands in for autograd's engine until the first backward pass."""

    def __init__(self, engine):
        self._engine = engine

    def run_backward(self, *args, **kwargs):
        from torch.autograd.variable import Variable
        Variable._execution_engine = self._engine
        from ..backend import runtime
        try:
            runtime.start()
        except ImportError:  # no torch_xla: nothing to start (DeepSpeed's import will say so)
            pass
        return self._engine.run_backward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _guard(module):
    if not isinstance(module.Variable._execution_engine, _StartRuntimeFirst):
        module.Variable._execution_engine = _StartRuntimeFirst(module.Variable._execution_engine)


_HOOK = PostImportHook(AUTOGRAD_MODULE, _guard)


def install():
    """Start the runtime at the next backward pass of this process, once torch's autograd has loaded
    (idempotent). Too late once a backward pass has run without it: autograd has sized its queues by then."""
    arm(_HOOK)


def pending():
    """True while the runtime waits for the first backward pass to start it."""
    from torch.autograd.variable import Variable
    return isinstance(Variable._execution_engine, _StartRuntimeFirst)
