"""Selects XLA_Accelerator while DeepSpeed is being imported, when DS_ACCELERATOR=xla.

`deepspeed_xla.pth` calls `install()` at interpreter start only when DS_ACCELERATOR=xla, so
every process qualifies: the `deepspeed` launcher parent, the workers it starts, and
multiprocessing spawn/forkserver children. DeepSpeed calls get_accelerator() during
its own import, rejects names it does not know, and binds its op builders to the
accelerator it gets then, so the accelerator must be in place the moment
`deepspeed.accelerator.real_accelerator` has executed, before anything else in
DeepSpeed runs: a post-import hook (xla_host/import_hooks.py) on that one module.
"""

import sys

from xla_host.import_hooks import REAL_ACCELERATOR, PostImportHook, arm

from . import backend


def _install_accelerator(module):
    from .launch import is_launcher_parent
    launcher_parent = is_launcher_parent()
    from ._xla_accelerator import XLA_Accelerator
    try:
        if not launcher_parent:
            backend.load()  # workers must load it before DeepSpeed touches a device
        accelerator = XLA_Accelerator(launcher_parent=launcher_parent)
    except ValueError as err:  # a DS_XLA_* setting that makes no sense: one line, not a traceback
        raise SystemExit(f"deepspeed_xla: {err}") from None
    module.set_accelerator(accelerator)


def _install_backward_guard(module):
    from . import backward_guard
    backward_guard.install()


_HOOK = PostImportHook(REAL_ACCELERATOR, _install_accelerator)
# A backward pass before DeepSpeed loads must not leave XLA without autograd queues (backward_guard.py).
_AUTOGRAD_HOOK = PostImportHook("torch.autograd.variable", _install_backward_guard)


def install():
    """Arm the hook for this process (a no-op when already armed)."""
    from .launch import install_launcher_hooks  # the `deepspeed` runner and TPU workers (launch.py)
    install_launcher_hooks()
    if REAL_ACCELERATOR in sys.modules:
        raise RuntimeError("deepspeed_xla: DeepSpeed was imported before the XLA accelerator could be installed, "
                           "and its op builders are bound to the accelerator it chose then. Set DS_ACCELERATOR=xla, "
                           "or call deepspeed_xla.activate() before importing deepspeed.")
    arm(_AUTOGRAD_HOOK)
    arm(_HOOK)
    from . import huggingface  # transformers and Accelerate see DeepSpeed's world, if a script imports them
    huggingface.install()
