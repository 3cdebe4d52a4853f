"""DeepSpeed's test helper `unit.util.bf16_required_version_check`, answered for the candidate.

DeepSpeed's tests run a bf16 case only where that helper returns True: on CUDA with NCCL >= 2.10, and on
the accelerators it names (npu, hpu, xpu), each added by the pull request that brought it. For any other
accelerator it returns False and DeepSpeed skips the case ("DeepSpeed BFloat16 tests need torch >= 1.10,
NCCL >= 2.10.3, CUDA > =11.0 and HW support"): on the candidate's side that would skip the bf16 half of
test_bf16.py, test_ds_initialize.py and the universal checkpoint tests, although bf16 is the half precision
XLA devices compute. On the candidate's side only, the helper also answers True where the accelerator says
it supports bf16 (`is_bf16_supported()`; True when called with accelerator_check=False), as it does for the
accelerators it names. The baseline keeps DeepSpeed's answer, so such a case reads "candidate-only-pass".

A DistributedTest's ranks import the test module afresh (spawned or forked from a fresh forkserver), so
the answer is installed at interpreter start in every candidate process (candidate_site/sitecustomize.py,
ENV set by `upstream.side_envs`), as a hook that wraps the helper when `unit.util` is first imported,
before any test module binds it by name.
"""

import functools
import importlib.abc
import importlib.machinery
import sys

ENV = "HARNESS_UPSTREAM_BF16_CHECK"
MODULE, HELPER = "unit.util", "bf16_required_version_check"


def answered_for_the_candidate(helper):
    """`helper` (DeepSpeed's) that also returns True where the current accelerator supports bf16."""

    @functools.wraps(helper)
    def check(accelerator_check=True):
        if helper(accelerator_check):
            return True
        from deepspeed.accelerator import get_accelerator
        return not accelerator_check or bool(get_accelerator().is_bf16_supported())

    return check


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds `unit.util` as the path finder does, and wraps its helper once the module has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            if hasattr(module, HELPER):
                setattr(module, HELPER, answered_for_the_candidate(getattr(module, HELPER)))

        spec.loader.exec_module = exec_module
        return spec


def install():
    """Wrap the helper in this process: now if `unit.util` is already imported, else when it is."""
    module = sys.modules.get(MODULE)
    if module is not None and hasattr(module, HELPER):
        setattr(module, HELPER, answered_for_the_candidate(getattr(module, HELPER)))
    elif not any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())
