"""Shared setup for the project's own tests: PJRT CPU unless told otherwise."""

import gc
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

# A DeepSpeed-shaped tests tree that `python -m harness upstream` runs (test_harness_upstream.py), not ours.
collect_ignore = ["upstream_tree"]

# DeepSpeed's C++ ops prebuilt in the stack (scripts/xla_stack.py): no test JIT-builds one.
from harness.environment import use_stack_extensions  # noqa: E402

use_stack_extensions()


def pytest_collection_modifyitems(items):
    """The slow tests first, longest-known first within them (their collection order): with several workers
    the run then ends on short tests instead of waiting on a long one started last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    """The test modules and what they imported (torch, torch_xla, DeepSpeed) live as long as the worker: out of
    the cyclic collector, they no longer cost every later full collection a walk over them."""
    gc.freeze()
