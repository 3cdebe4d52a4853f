"""Suite registry: which conformance modules a `--suite` name runs.

A conformance module belongs to an area by its file name, `conformance/test_<area>_*.py`
(or `test_<area>.py`), and declares the same area with `pytestmark = pytest.mark.area(...)`.
Every area is a suite of its own; `all` runs every check of every area (the nightly's run). A new
area only needs a name here, and its entry in SMOKE.

`standard` (what `tox -e cpu` runs) is every area less the checks NIGHTLY names: the suite's time
budget on 2 cores (15 minutes) is kept by choosing where a check runs, never by dropping it. Each
entry says which checks of the standard suite keep the capability it checks.

`smoke` runs every area too, but only the checks SMOKE names: for each area, test ids
(`test_module.py::test_name[params]`; `*` matches any text) that between them exercise the
area's machinery once, so that a run takes minutes and a broken area still shows.
"""

import re
from pathlib import Path

from harness.paths import CONFORMANCE

AREAS = ("interface", "launcher", "collectives", "lowering", "zero", "pipeline", "checkpoint", "graph", "scripts", "huggingface",
         "multihost")
SUITES = {**{area: (area, ) for area in AREAS}, "all": AREAS, "standard": AREAS, "smoke": AREAS}

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

# area -> {test id pattern: the checks that keep its capability in the standard suite}. Chosen by
# benchmarks/suite_time.py's figures: the costliest checks whose capability another check keeps.
NIGHTLY = {
    "zero": {
        "*[zero0-fp32-2rank]": "ZeRO-0 at 2 ranks in bf16, and in fp32 at 1 rank",
        "*[zero1-fp32-2rank]": "ZeRO-1 at 2 ranks in bf16, and in fp32 at 1 rank",
    },
    "checkpoint": {
        "*[candidate-to-candidate-zero2]": "the same round trip at ZeRO-3; ZeRO-2's checkpoint saved on the candidate "
                                           "resumed on CPU",
        "*[cpu-to-candidate-zero2]": "a checkpoint saved on CPU resumed on the candidate at ZeRO-3",
    },
    "scripts": {
        "*[parameter-list-zero1-2rank]": "a parameter list at ZeRO 0-3 on 1 rank and ZeRO-3 on 2",
        "*[param-groups-zero3-2rank]": "param groups on 1 rank; HuggingFace-style param groups through "
                                       "deepspeed.initialize at ZeRO-1 and ZeRO-3 on 2 ranks (huggingface)",
        "*[tied-weights-zero2-2rank]": "tied weights at ZeRO-2 and -3 on 1 rank; GPT-2's tied embeddings through "
                                       "Accelerate at ZeRO-2 and -3 on 2 ranks (huggingface)",
    },
    "huggingface": {
        "*[initialize-gpt2-zero3-bf16-2rank]": "bf16 ZeRO-3 on 2 ranks through Accelerate; deepspeed.initialize at "
                                               "ZeRO-3 on 2 ranks (from_pretrained); GPT-2 through Accelerate",
    },
    "multihost": {
        "*[pipeline-2stages-x2dp-2hosts-x2]": "ZeRO-3 over the same 2 hosts; the same pipeline on 4 ranks of one host "
                                              "(pipeline)",
    },
}

SELECTIONS = {"smoke": SMOKE}  # selective suite -> {area: the test id patterns it runs}
EXCLUSIONS = {"standard": NIGHTLY}  # excluding suite -> {area: {the test id patterns it leaves out: why}}


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
    areas' checks, for a selective suite only those its table names for the module's area, for an
    excluding suite all but those its table names."""
    return left_out_by(suite, test_id) is None


def left_out_by(suite, test_id):
    """Why `suite` does not run the check `test_id` (one line), or None when it runs it."""
    area = area_of_module(test_id.split("::", 1)[0])
    if suite in SELECTIONS:
        if any(id_matches(pattern, test_id) for pattern in SELECTIONS[suite].get(area, ())):
            return None
        return f"not one of the {suite} suite's checks of area {area}"
    kept_by = next((why for pattern, why in EXCLUSIONS.get(suite, {}).get(area, {}).items()
                    if id_matches(pattern, test_id)), None)
    return f"left to suite all (nightly); its capability checked here by {kept_by}" if kept_by else None


def id_matches(pattern, test_id):
    """Whether `test_id` matches `pattern`, in which only `*` is special (any text): test ids
    contain [brackets] that fnmatch would read as character sets."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), test_id) is not None


def may_select(suite, test_id):
    """Whether `suite` can run a check that `test_id` (a repository-relative id, `*` allowed) names."""
    return "*" in test_id or selects(suite, test_id)
