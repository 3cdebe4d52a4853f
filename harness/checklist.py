"""The interface checklist: which DeepSpeedAccelerator methods the installed DeepSpeed defines,
and which interface checks cover them.

Derived at run time, so a DeepSpeed release that adds a method shows it as unchecked.
A check covers a method by its name: `test_<method>` or `test_<method>__<aspect>`.
"""

import inspect


def interface_methods():
    """Abstract methods plus the public hooks DeepSpeedAccelerator implements itself."""
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
    hooks = {
        name
        for name, value in vars(DeepSpeedAccelerator).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, (property, staticmethod)))
    }
    return sorted(set(DeepSpeedAccelerator.__abstractmethods__) | hooks)


def method_of(test_name, methods):
    """The method a check named `test_name` covers (parameters ignored), or None."""
    base = test_name.split("[", 1)[0]
    if not base.startswith("test_"):
        return None
    method = base[len("test_"):].split("__", 1)[0]
    return method if method in methods else None


def coverage(methods, checked):
    """coverage.interface of report.json: every method, and those no check ran for."""
    checked = set(checked) & set(methods)
    return {
        "total": len(methods),
        "checked": len(checked),
        "unchecked": sorted(set(methods) - checked),
    }
