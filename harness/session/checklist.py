"""The interface checklist: which DeepSpeedAccelerator methods the installed DeepSpeed defines,
and which interface checks cover them.

Derived at run time, so a DeepSpeed release that adds a method shows it as unchecked.
A check covers the one method its `covers` marker names (`@pytest.mark.covers("device_count")`; on
a pytest.param, each parameter of one check covers its own sibling method); a check without one
covers the method its name names: `test_<method>` or `test_<method>__<aspect>`.
"""

import difflib
import inspect


class ChecklistError(ValueError):
    """An interface check that covers no DeepSpeedAccelerator method; the message says why."""


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
    """The method a check named `test_name` covers by the name rule (parameters ignored), or None."""
    base = test_name.split("[", 1)[0]
    if not base.startswith("test_"):
        return None
    method = base[len("test_"):].split("__", 1)[0]
    return method if method in methods else None


def method_of_test_id(test_name, methods):
    """The method of a check known only by its test id (its process ended before it reported): the
    name rule, else its parameter id when that names a method (conformance_helpers.covering gives
    each covering param its method as id); None when neither does."""
    param = test_name.partition("[")[2].rstrip("]")
    return method_of(test_name, methods) or (param if param in methods else None)


def covered_method(test_name, covers, methods):
    """The one method an interface check covers (its `method` in report.json): the one its covers
    markers name (`covers`, the markers' names; empty without one), else the one its name names.
    ChecklistError when the markers name several methods (a check with one id covers one method:
    parametrize it, one covering param per method), a marked name is not one of `methods`, or the
    check names none."""
    names = list(dict.fromkeys(covers))
    if len(names) > 1:
        raise ChecklistError(f"covers {', '.join(map(repr, names))}; a check covers one method: parametrize it "
                             "with one pytest.param marked covers(<method>) per method")
    if names:
        if names[0] not in methods:
            close = difflib.get_close_matches(str(names[0]), methods, n=1)
            raise ChecklistError(f"covers {names[0]!r}, which DeepSpeedAccelerator does not define"
                                 + (f" (did you mean {close[0]!r}?)" if close else ""))
        return names[0]
    method = method_of(test_name, methods)
    if method is None:
        raise ChecklistError("names no method of DeepSpeedAccelerator; name it test_<method> or test_<method>__<aspect>, "
                             "or mark it @pytest.mark.covers(<method>)")
    return method


def coverage(methods, checked):
    """coverage.interface of report.json: every method, and those no check ran for. `checked`: the
    `method` of each check that ran (a method name, or None)."""
    checked = set(checked) & set(methods)
    return {
        "total": len(methods),
        "checked": len(checked),
        "unchecked": sorted(set(methods) - checked),
    }
