"""Selects XLA_Accelerator while DeepSpeed is being imported, when DS_ACCELERATOR=xla.

Loaded at interpreter start by `deepspeed_xla.pth` only when DS_ACCELERATOR=xla, so
every process qualifies: the `deepspeed` launcher parent, the workers it starts, and
multiprocessing spawn/forkserver children. DeepSpeed calls get_accelerator() during
its own import and rejects names it does not know, so the accelerator must be in place
the moment `deepspeed.accelerator.real_accelerator` has executed, before anything else
in DeepSpeed runs: a meta-path finder wraps that one module's loader.
"""

import importlib.abc
import importlib.machinery
import sys

_TARGET = "deepspeed.accelerator.real_accelerator"
INSTALL_HINT = ("deepspeed_xla: DS_ACCELERATOR=xla needs torch_xla, which is not installed. "
                "Install it with `pip install deepspeed-xla[tpu]` on a TPU VM, or `pip install torch_xla==2.9.0` "
                "for PJRT CPU, or unset DS_ACCELERATOR.")


def _install_accelerator(module):
    try:
        import torch_xla  # noqa: F401  (workers must load it before DeepSpeed touches xla devices)
    except ImportError:
        raise SystemExit(INSTALL_HINT) from None
    from .accelerator import XLA_Accelerator
    module.set_accelerator(XLA_Accelerator())


class _Loader(importlib.abc.Loader):

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _install_accelerator(module)


class _Finder(importlib.abc.MetaPathFinder):

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install():
    if _TARGET in sys.modules:
        _install_accelerator(sys.modules[_TARGET])
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
