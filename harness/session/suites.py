"""Suite registry: which conformance modules a `--suite` name runs.

A conformance module belongs to an area by its file name, `conformance/test_<area>_*.py`
(or `test_<area>.py`), and declares the same area with `pytestmark = pytest.mark.area(...)`.
Every area is a suite of its own; `all` runs every area. A new area only needs a name here,
and its entry in SMOKE.

`smoke` runs every area too, but only the checks SMOKE names: for each area, test ids
(`test_module.py::test_name[params]`; `*` matches any text) that between them exercise the
area's machinery once, so that a run takes minutes and a broken area still shows.
"""

import re
from pathlib import Path

from harness.paths import CONFORMANCE

AREAS = ("interface", "launcher", "collectives", "lowering", "zero", "pipeline", "checkpoint", "graph", "scripts", "huggingface",
         "multihost")
SUITES = {**{area: (area, ) for area in AREAS}, "all": AREAS, "smoke": AREAS}

SMOKE = {
    "interface": ("*", ),  # in-process and quick: the whole checklist
    "launcher": ("*[num_gpus-2]", "*__launched_ranks"),
    "collectives": ("*[all_reduce_sum-2ranks]", "*[all_reduce_avg-2ranks]", "*[reduce_scatter_tensor-2ranks]",
                    "*[all_gather_into_tensor-2ranks]", "*[broadcast_from_last-2ranks]"),
    "lowering": ("*", ),  # traced, not run: seconds
    "zero": ("*[zero2-fp32-1rank]", "*[zero3-bf16-1rank]"),
    "pipeline": ("*[2stages-2ranks]", ),
    "checkpoint": ("*[candidate-to-cpu-zero2]", ),
    "graph": ("*", ),  # one small model per config, all in one fresh process
    "scripts": ("*[parameter-list-zero2-1rank]", "*[client-optimizer-zero1-1rank]"),
    "huggingface": ("*[trainer-llama-zero2-2rank]", "*[accelerate-gpt2-zero3-2rank]"),
    "multihost": ("*[zero3-fp32-2hosts-x2]", "*::test_launched_ranks_follow_the_hostfile", "*::test_tpu_slice_ranks_*",
                  "*_in_one_line"),
}
SELECTIONS = {"smoke": SMOKE}  # selective suite -> {area: test id patterns}



class UnknownSuite(ValueError):
    """A --suite name not registered in SUITES (bad usage: `run` reports it on one line, exit 2)."""
    pass


def area_of_module(filename):
    """The area a conformance module belongs to by its file name, or None."""
    stem = Path(filename).stem
    for area in AREAS:
        if stem == f"test_{area}" or stem.startswith(f"test_{area}_"):
            return area
    return None


def modules_for(suite, root=CONFORMANCE):
    """Conformance module paths a suite runs, sorted; UnknownSuite for a name not registered."""
    if suite not in SUITES:
        raise UnknownSuite(f"unknown suite {suite!r}; known suites: {', '.join(sorted(SUITES))}")
    areas = SUITES[suite]
    return sorted(path for path in Path(root).glob("test_*.py") if area_of_module(path) in areas)


def selects(suite, test_id):
    """Whether `suite` runs the check `test_id` (`[path/]test_<area>_*.py::name[params]`): all of its
    areas' checks, or for a selective suite only those its table names for the module's area."""
    if suite not in SELECTIONS:
        return True
    patterns = SELECTIONS[suite].get(area_of_module(test_id.split("::", 1)[0]), ())
    return any(id_matches(pattern, test_id) for pattern in patterns)


def id_matches(pattern, test_id):
    """Whether `test_id` matches `pattern`, in which only `*` is special (any text): test ids
    contain [brackets] that fnmatch would read as character sets."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), test_id) is not None


def may_select(suite, test_id):
    """Whether `suite` can run a check that `test_id` (a repository-relative id, `*` allowed) names."""
    return "*" in test_id or selects(suite, test_id)
