"""The packages' import structure, read from their source: no import cycle inside a package, the layers
(conformance -> harness -> xla_host <- deepspeed_xla) never import upwards or across, and the patch table
(deepspeed_xla/patches/__init__.py) names every patch module; tests/README.md names every test module."""

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("deepspeed_xla", "xla_host", "harness")


def _modules(package):
    """{dotted name: source path} of every module of `package` (a folder at the repository root)."""
    modules = {}
    for path in (REPO / package).rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(name, path, known):
    """The names in `known` that module `name` imports anywhere in its source (functions included: a lazy import
    still ties the two modules), each resolved to the longest known module; its own ancestor packages left out (a
    submodule always loads after its package has begun)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known]
            targets = submodules + ([source] if len(submodules) < len(node.names) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _cycle(graph):
    """One import cycle of `graph` ({module: modules it imports}) as a list that starts and ends with the same
    module, or None."""
    state, path = {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_the_package(package):
    modules = _modules(package)
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, f"{package}: modules import each other in a circle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("package, forbidden", [
    ("xla_host", {"deepspeed_xla", "harness", "conformance"}),  # shared by both sides, part of neither
    ("deepspeed_xla", {"harness", "conformance"}),
    ("harness", {"deepspeed_xla", "conformance"}),  # the harness checks any candidate, never imports ours
])
def test_layers_never_import_upwards_or_across(package, forbidden):
    everything = {name: path for top in forbidden for name, path in _modules(top).items()}
    wrong = {name: sorted(_imported(name, path, everything)) for name, path in _modules(package).items()}
    wrong = {name: targets for name, targets in wrong.items() if targets}
    assert not wrong, f"{package} imports what it must not: {wrong}"


def test_the_patch_table_names_every_patch_module_and_each_installs():
    from deepspeed_xla import patches
    listed = {patch.module for patch in patches.PATCHES}
    modules = _modules("deepspeed_xla")
    helpers = {target for module in listed if module in modules
               for target in _imported(module, modules[module], modules)}
    unlisted = {name for name in modules if name.startswith("deepspeed_xla.patches.")} - listed - helpers
    assert not unlisted, f"patch modules missing from deepspeed_xla/patches/__init__.py's table: {sorted(unlisted)}"
    for patch in patches.PATCHES:
        assert patch.phases and set(patch.phases) <= set(patches.PHASES), f"{patch.module}: phases {patch.phases}"
        assert callable(getattr(importlib.import_module(patch.module), "install", None)), (
            f"{patch.module} has no install()")
    with pytest.raises(ValueError, match="unknown patch phase"):
        patches.install("engine")


def test_the_tests_readme_names_every_test_module():
    readme = (REPO / "tests" / "README.md").read_text()
    unnamed = sorted(path.name for path in (REPO / "tests").glob("test_*.py") if f"`{path.name}`" not in readme)
    assert not unnamed, f"tests/README.md does not say what these test: {unnamed}"
