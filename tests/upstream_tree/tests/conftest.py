"""Like DeepSpeed's tests/conftest.py: a DistributedTest runs its ranks instead of the test body."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if getattr(item.cls, "is_dist_test", False):
        item.cls()(item)
        item.runtest = lambda: True
