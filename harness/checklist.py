"""The interface checklist: which DeepSpeedAccelerator methods the installed DeepSpeed defines,
and which interface checks cover them.

Derived at run time, so a DeepSpeed release that adds a method shows it as unchecked.
A check covers the methods its `covers` markers name (`@pytest.mark.covers("device_count")`; on a
pytest.param, each parameter of one check covers a sibling method); a check without one covers the
method its name names: `test_<method>` or `test_<method>__<aspect>`.
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


def methods_of(test_name, covers, methods):
    """The methods an interface check covers, in order: those its covers markers name (`covers`;
    empty without a marker), else the one its name names. ChecklistError when a marked name is not
    one of `methods` (the check is not counted for its other names either) or the check has neither."""
    if covers:
        unknown = [name for name in covers if name not in methods]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), methods, n=1)
            raise ChecklistError(f"covers {', '.join(map(repr, unknown))}, which DeepSpeedAccelerator does not define"
                                 + (f" (did you mean {close[0]!r}?)" if close else ""))
        return list(dict.fromkeys(covers))
    method = method_of(test_name, methods)
    if method is None:
        raise ChecklistError("names no method of DeepSpeedAccelerator; name it test_<method> or test_<method>__<aspect>, "
                             "or mark it @pytest.mark.covers(<method>, ...)")
    return [method]


def result_method(covered):
    """A check's `method` in report.json: the method it covers, or its methods space-separated (a
    plain string, as report.json has always held; coverage() counts each)."""
    return " ".join(covered)


def coverage(methods, checked):
    """coverage.interface of report.json: every method, and those no check ran for. `checked`: the
    `method` of each check that ran (result_method's string, or None)."""
    checked = {name for field in checked if field for name in field.split()} & set(methods)
    return {
        "total": len(methods),
        "checked": len(checked),
        "unchecked": sorted(set(methods) - checked),
    }
