"""Run code right after a module (DeepSpeed's) loads, without editing its files.

DeepSpeed fixes some choices while its modules import (its accelerator, the op builders
bound to it, the launcher's entry point). A `PostImportHook` on `sys.meta_path` wraps one
module's loader: `on_loaded(module)` runs as soon as the module has executed, before the
importer sees it; `on_run_as_main()` runs before the module's code when `python -m` runs
it (runpy asks the loader for the code instead of executing it). Several hooks armed for one module
all run, in the order they were armed.
"""

import importlib.abc
import importlib.machinery
import sys

REAL_ACCELERATOR = "deepspeed.accelerator.real_accelerator"  # DeepSpeed picks its accelerator while this loads
# The same file as a top-level package in a DeepSpeed source layout (a checkout on sys.path, an editable install):
# DeepSpeed's op builders import `accelerator` before `deepspeed.accelerator`, so a second copy of the module,
# with its own accelerator, loads beside the first.
SOURCE_REAL_ACCELERATOR = "accelerator.real_accelerator"


class PostImportHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta-path finder for one module name whose loader runs `on_loaded(module)` after the module
    executes, and `on_run_as_main()` before its code when `python -m` runs it."""

    def __init__(self, module_name, on_loaded, on_run_as_main=None):
        self.module_name = module_name
        self.on_loaded = on_loaded
        self._on_run_as_main = on_run_as_main
        self._loader = None
        self._followers = []  # hooks armed later for the same module, run after this one

    def find_spec(self, fullname, path, target=None):
        """importlib's MetaPathFinder.find_spec: for `module_name` only, the spec PathFinder finds with this hook as its loader
        (the real loader kept to delegate to); None for other names or when the module is not on `path`/sys.path."""
        if fullname != self.module_name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        """importlib's Loader.create_module, delegated to the real loader (None for a .py module: default creation)."""
        return self._loader.create_module(spec)

    def exec_module(self, module):
        """importlib's Loader.exec_module: run the module's code with the real loader, then `on_loaded(module)`; an exception from
        either propagates to the importer, and the module is not left in sys.modules."""
        self._loader.exec_module(module)
        for hook in [self, *self._followers]:
            hook.on_loaded(module)

    def get_code(self, fullname):
        """The module's code object for runpy (`python -m`), after `on_run_as_main()` if one was given; the code then runs as
        __main__, so `on_loaded` is not called."""
        for hook in [self, *self._followers]:
            if hook._on_run_as_main is not None:
                hook._on_run_as_main()
        return self._loader.get_code(fullname)

    def __getattr__(self, name):
        # Anything else runpy or importlib asks of a loader (get_source, is_package, ...).
        return getattr(self._loader, name)


def wrap_once(owner, name, wrap):
    """Replace `owner.name` with `wrap(original)` unless it is already one of ours (a wrapper
    carries `_wrapped_once`), so that arming twice never wraps twice."""
    original = getattr(owner, name)
    if getattr(original, "_wrapped_once", False):
        return
    wrapper = wrap(original)
    wrapper._wrapped_once = True
    setattr(owner, name, wrapper)


def arm(hook):
    """Put `hook` in place for this process, once; if its module is already loaded, act now. A hook for a module
    that another hook in sys.meta_path already waits for runs after that one."""
    loaded = sys.modules.get(hook.module_name)
    if loaded is not None:
        hook.on_loaded(loaded)  # it ran before the hook could see it: do now what the hook would have done
        return
    first = next((finder for finder in sys.meta_path
                  if isinstance(finder, PostImportHook) and finder.module_name == hook.module_name), None)
    if first is None:
        sys.meta_path.insert(0, hook)
    elif hook is not first and hook not in first._followers:
        first._followers.append(hook)
