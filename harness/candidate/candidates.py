"""Candidate accelerators: parsing `--candidate SPEC` and installing the candidate in a process.

SPEC is one of
  deepspeed_xla           this project's accelerator, activated by DS_ACCELERATOR=xla
  in-tree[:NAME]          DeepSpeed's own accelerator for DS_ACCELERATOR=NAME (default xla): a
                          DeepSpeed branch that supports XLA itself (upstream attempts use xla or tpu)
  module:Class            a class importable from a module
  path/to/file.py:Class   a class defined in a Python file

The orchestrator only parses the spec (usage errors are exit 2). Every process that runs
checks installs it (`candidate_env.install_current()`) before anything imports DeepSpeed; failures to import or build
the candidate are CandidateError with a one-line reason, reported as a failed run.
"""

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from xla_host.import_hooks import REAL_ACCELERATOR, SOURCE_REAL_ACCELERATOR, PostImportHook, arm

_DEEPSPEED_XLA_CLASS = ("deepspeed_xla.accelerator", "XLA_Accelerator")
DEFAULT_SPEC = "deepspeed_xla"
# The harness sets it ('highest' on TPU) for every candidate's processes; deepspeed_xla reads it too.
MATMUL_PRECISION_ENV = "DS_XLA_MATMUL_PRECISION"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FORMS = "expected deepspeed_xla, in-tree[:NAME], module:Class or path/to/file.py:Class"
IN_TREE_DEFAULT_NAME = "xla"


class SpecError(ValueError):
    """A malformed --candidate value (bad usage)."""


# What a candidate's import or construction may raise and we report as its failure: any error, even
# sys.exit. Not KeyboardInterrupt: a Ctrl-C or SIGTERM that lands while a slow candidate imports is the
# user's, and must stop the run, not turn into a failed candidate whose checks then run on.
_CANDIDATE_FAULTS = (Exception, SystemExit)


class CandidateError(RuntimeError):
    """The candidate could not be imported, built or installed (a failed run)."""


@dataclass(frozen=True)
class CandidateSpec:
    """A parsed --candidate SPEC (parse_spec): `text` as given, its `kind`, and for module/file candidates the module name or
    absolute .py path (`target`) and class name (`attr`); for in-tree, `target` is the DS_ACCELERATOR name."""
    text: str
    kind: str  # "deepspeed_xla", "in-tree", "module" or "file"
    target: str = ""  # module name, file path, or the DS_ACCELERATOR name of an in-tree accelerator
    attr: str = ""  # class name

    @property
    def name(self):
        """Short name used for expectation files and report titles."""
        if self.kind == "deepspeed_xla":
            return self.kind
        if self.kind == "in-tree":
            return "in-tree" if self.target == IN_TREE_DEFAULT_NAME else f"in-tree-{self.target}"
        base = Path(self.target).stem if self.kind == "file" else self.target
        return f"{base}.{self.attr}"

    @property
    def canonical(self):
        """The spec with a file candidate's path made absolute (child processes run elsewhere)."""
        return f"{self.target}:{self.attr}" if self.kind == "file" else self.text


def parse_spec(text):
    """CandidateSpec for `text`, or SpecError with a one-line reason."""
    text = (text or "").strip()
    if text == "deepspeed_xla":
        return CandidateSpec(text, text)
    if text == "in-tree" or text.startswith("in-tree:"):
        name = text.partition(":")[2] or IN_TREE_DEFAULT_NAME
        if not _IDENTIFIER.match(name):
            raise SpecError(f"candidate {text!r}: {name!r} is not an accelerator name (DS_ACCELERATOR); {_FORMS}")
        return CandidateSpec(text, "in-tree", name)
    target, sep, attr = text.rpartition(":")
    if not sep:
        raise SpecError(f"candidate {text!r} names no class; {_FORMS}")
    if not target:
        raise SpecError(f"candidate {text!r} names no module or file before ':'; {_FORMS}")
    if not _IDENTIFIER.match(attr):
        raise SpecError(f"candidate {text!r}: {attr!r} is not a class name; {_FORMS}")
    if target.endswith(".py") or "/" in target or os.sep in target:
        if not target.endswith(".py"):
            raise SpecError(f"candidate {text!r}: a file candidate must be a .py file; {_FORMS}")
        return CandidateSpec(text, "file", str(Path(target).resolve()), attr)
    if not _MODULE.match(target):
        raise SpecError(f"candidate {text!r}: {target!r} is not a module name; {_FORMS}")
    return CandidateSpec(text, "module", target, attr)


def _import_target(spec):
    if spec.kind == "module":
        return importlib.import_module(spec.target)
    path = Path(spec.target)
    if not path.is_file():
        raise CandidateError(f"candidate file {spec.target} does not exist")
    module_name = f"harness_candidate_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look classes up here
    module_spec.loader.exec_module(module)
    return module


def _build(spec):
    """Import and construct a module/file candidate."""
    try:
        module = _import_target(spec)
    except CandidateError:
        raise
    except _CANDIDATE_FAULTS as err:
        raise CandidateError(f"cannot import candidate {spec.text}: {type(err).__name__}: {err}") from None
    cls = getattr(module, spec.attr, None)
    if cls is None:
        raise CandidateError(f"candidate {spec.text}: {spec.target} has no attribute {spec.attr!r}")
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
    if not (isinstance(cls, type) and issubclass(cls, DeepSpeedAccelerator)):
        raise CandidateError(f"candidate {spec.text}: {spec.attr} is not a DeepSpeedAccelerator subclass")
    try:
        return cls()
    except _CANDIDATE_FAULTS as err:
        raise CandidateError(f"candidate {spec.text}: constructing {spec.attr}() failed: "
                             f"{type(err).__name__}: {err}") from None


def _resolve_by_name(spec):
    """The accelerator DeepSpeed resolves for DS_ACCELERATOR=<name> (deepspeed_xla: xla)."""
    name = spec.target if spec.kind == "in-tree" else "xla"
    previous = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = name
    try:
        from deepspeed.accelerator import get_accelerator
        accelerator = get_accelerator()
    except _CANDIDATE_FAULTS as err:
        raise CandidateError(f"candidate {spec.text}: DeepSpeed did not accept DS_ACCELERATOR={name}: "
                             f"{type(err).__name__}: {err}") from None
    finally:
        # DeepSpeed keeps what it resolved. Children of an in-tree candidate's process must not
        # inherit DS_ACCELERATOR=xla: deepspeed_xla, if installed, would claim it at their start.
        if spec.kind == "in-tree" and previous is None:
            del os.environ["DS_ACCELERATOR"]
        elif spec.kind == "in-tree":
            os.environ["DS_ACCELERATOR"] = previous
    module = type(accelerator).__module__
    if spec.kind == "in-tree" and not module.startswith("deepspeed."):
        raise CandidateError(f"candidate {spec.text}: DS_ACCELERATOR={name} was answered by {module}, "
                             "not by DeepSpeed itself")
    if spec.kind == "deepspeed_xla" and not module.startswith("deepspeed_xla"):
        raise CandidateError(f"candidate deepspeed_xla: DS_ACCELERATOR=xla selected {module}; "
                             "is deepspeed_xla installed (its .pth start-up hook)?")
    return accelerator


class _CandidateInstaller:
    """Builds the candidate when DeepSpeed's real_accelerator module has executed (through
    deepspeed_xla's PostImportHook, the same route DS_ACCELERATOR=xla takes) and keeps any
    failure for a one-line report.

    DeepSpeed calls get_accelerator() while `import deepspeed` runs and binds op builders
    (deepspeed.ops.op_builder) to the accelerator it gets then: a candidate set after the
    import would run with CPU kernels behind DeepSpeed's optimizers.
    """

    def __init__(self, build):
        self._build = build
        self.accelerator = None
        self.error = None

    def __call__(self, module):
        try:
            self.accelerator = self._build()
            module.set_accelerator(self.accelerator)
        except CandidateError as err:
            self.error = err
        except Exception as err:
            self.error = CandidateError(f"DeepSpeed refused the candidate: {type(err).__name__}: {err}")


def _share_with_source_copy(copy):
    """A DeepSpeed source layout (DeepSpeed's tests, an editable install) loads real_accelerator a second time, as the
    top-level `accelerator.real_accelerator` its op builders import first. That copy gets the first copy's accelerator
    (the installed candidate: this hook is armed once it is in place) and supported list, as DS_ACCELERATOR gives both
    copies one accelerator name; left alone, it would pick DeepSpeed's CPU accelerator (or refuse the name) for the
    op builders."""
    if hasattr(copy, "SUPPORTED_ACCELERATOR_LIST"):  # else a top-level `accelerator` package that is not DeepSpeed's
        first = sys.modules[REAL_ACCELERATOR]
        copy.set_accelerator(first.get_accelerator())
        copy.SUPPORTED_ACCELERATOR_LIST[:] = first.SUPPORTED_ACCELERATOR_LIST


_SOURCE_COPY_HOOK = PostImportHook(SOURCE_REAL_ACCELERATOR, _share_with_source_copy)


def install(spec):
    """Install the candidate as DeepSpeed's accelerator in this process and return it; in a DeepSpeed source layout,
    in both copies of its accelerator module.

    Must run before anything imports DeepSpeed (see _InstallOnImport).
    """
    accelerator = _install(spec)
    arm(_SOURCE_COPY_HOOK)
    return accelerator


def _install(spec):
    try:
        import torch_xla  # noqa: F401  (must be loaded before DeepSpeed places anything on xla)
    except ImportError as err:
        raise CandidateError(f"torch_xla is not importable: {err}") from None
    if spec.kind == "deepspeed_xla" and os.environ.get("DS_ACCELERATOR") != "xla":
        # Started without DS_ACCELERATOR=xla (e.g. plain pytest): its start-up hook is not armed.
        spec = parse_spec(f"{_DEEPSPEED_XLA_CLASS[0]}:{_DEEPSPEED_XLA_CLASS[1]}")
    if spec.kind in ("deepspeed_xla", "in-tree"):
        return _resolve_by_name(spec)
    if REAL_ACCELERATOR in sys.modules:
        raise CandidateError(f"candidate {spec.text}: DeepSpeed was imported before the candidate could be "
                             "installed; install it first thing in the process")
    installer = _CandidateInstaller(lambda: _build(spec))
    hook = PostImportHook(REAL_ACCELERATOR, installer)
    sys.meta_path.insert(0, hook)
    try:
        import deepspeed.accelerator
    except _CANDIDATE_FAULTS as err:
        raise CandidateError(f"importing DeepSpeed with candidate {spec.text} failed: "
                             f"{installer.error or f'{type(err).__name__}: {err}'}") from None
    finally:
        sys.meta_path.remove(hook)
    if installer.error is not None:
        raise installer.error
    if deepspeed.accelerator.get_accelerator() is not installer.accelerator:
        raise CandidateError(f"candidate {spec.text}: DeepSpeed replaced it with another accelerator during import")
    _set_comparison_precision()
    return installer.accelerator


def _set_comparison_precision(environ=os.environ):
    """The fp32 matmul precision the harness compares at, for candidates that do not read
    MATMUL_PRECISION_ENV themselves (deepspeed_xla does): TPUs multiply fp32 in bf16 passes by default."""
    precision = environ.get(MATMUL_PRECISION_ENV, "").strip().lower()
    if precision:
        import torch_xla.backends
        torch_xla.backends.set_mat_mul_precision(precision)
