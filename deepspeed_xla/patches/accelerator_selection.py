"""DeepSpeed selects XLA_Accelerator while it is being imported, when DS_ACCELERATOR=xla.

DeepSpeed calls get_accelerator() during its own import, rejects names it does not know, and binds its
op builders to the accelerator it gets then, so the accelerator must be in place the moment
`deepspeed.accelerator.real_accelerator` has executed, before anything else in DeepSpeed runs: a
post-import hook on that one module sets it. In the launcher parent (launch.is_launcher_parent) the
accelerator answers host-side questions only and the XLA backend is not loaded; in every other
process the backend loads first (workers must load it before DeepSpeed touches a device).

The same hook adds the device name, "xla", to DeepSpeed's SUPPORTED_ACCELERATOR_LIST, which
`is_current_accelerator_supported()` reads: with the accelerator installed, DeepSpeed supports it.
DeepSpeed's own test helpers (`skip_on_arch`) assert that answer before they run a test.

A DeepSpeed source layout (a checkout on sys.path, as DeepSpeed's tests/conftest.py puts it, or an
editable install) loads the module twice: also as the top-level `accelerator.real_accelerator`,
which DeepSpeed's op builders import first. Each copy keeps its own accelerator and list, so the hook
watches both and gives them one XLA_Accelerator; otherwise the op builders' copy, which does not know
"xla", refuses DS_ACCELERATOR=xla at the first op lookup (init_distributed's shared-memory probe).
"""

import sys

from xla_host.import_hooks import REAL_ACCELERATOR, SOURCE_REAL_ACCELERATOR, PostImportHook, arm

from .. import backend

_accelerator = None  # the process's one XLA_Accelerator, shared by both copies of DeepSpeed's module


def _process_accelerator():
    global _accelerator
    if _accelerator is None:
        from .._xla_accelerator import XLA_Accelerator
        from .launch import is_launcher_parent
        launcher_parent = is_launcher_parent()
        try:
            if not launcher_parent:
                backend.load()
            _accelerator = XLA_Accelerator(launcher_parent=launcher_parent)
        except ValueError as err:  # a DS_XLA_* setting that makes no sense: one line, not a traceback
            raise SystemExit(f"deepspeed_xla: {err}") from None
    return _accelerator


def _set_accelerator(module):
    if not hasattr(module, "SUPPORTED_ACCELERATOR_LIST"):
        return  # a top-level `accelerator` package that is not DeepSpeed's
    accelerator = _process_accelerator()
    module.set_accelerator(accelerator)
    if accelerator.device_name() not in module.SUPPORTED_ACCELERATOR_LIST:
        module.SUPPORTED_ACCELERATOR_LIST.append(accelerator.device_name())


_HOOKS = (PostImportHook(REAL_ACCELERATOR, _set_accelerator), PostImportHook(SOURCE_REAL_ACCELERATOR, _set_accelerator))


def install():
    """Arm the hooks for this process (a no-op when already armed); RuntimeError when DeepSpeed's accelerator module
    has already loaded, with the accelerator it chose then."""
    if REAL_ACCELERATOR in sys.modules:
        raise RuntimeError("deepspeed_xla: DeepSpeed was imported before the XLA accelerator could be installed, "
                           "and its op builders are bound to the accelerator it chose then. Set DS_ACCELERATOR=xla, "
                           "or call deepspeed_xla.activate() before importing deepspeed.")
    for hook in _HOOKS:
        arm(hook)
