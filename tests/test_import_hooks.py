"""Post-import hooks (xla_host/import_hooks.py), on real imports of a module written for the test: every hook armed
for one module runs once, in the order armed, after the module's code; a hook armed after the load acts at once."""

import sys

from xla_host.import_hooks import PostImportHook, arm


def test_every_hook_armed_for_one_module_runs_once_in_order(tmp_path, monkeypatch):
    (tmp_path / "hooked_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    ran = []
    first = PostImportHook("hooked_module", lambda module: ran.append(("first", module.VALUE)))
    second = PostImportHook("hooked_module", lambda module: ran.append(("second", module.VALUE)))
    for hook in (first, second, first, second):
        arm(hook)
    try:
        import hooked_module  # noqa: F401
        assert ran == [("first", 1), ("second", 1)]
        late = PostImportHook("hooked_module", lambda module: ran.append(("late", module.VALUE)))
        arm(late)
        assert ran[-1] == ("late", 1)
    finally:
        sys.modules.pop("hooked_module", None)
