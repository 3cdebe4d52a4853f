"""Suite registry: which conformance modules a `--suite` name runs.

A conformance module belongs to an area by its file name, `conformance/test_<area>_*.py`
(or `test_<area>.py`), and declares the same area with `pytestmark = pytest.mark.area(...)`.
Every area is a suite of its own; `all` runs every area. A new area only needs a name here.
"""

from pathlib import Path

AREAS = ("interface", "launcher", "collectives", "lowering", "zero", "pipeline", "checkpoint", "graph", "scripts")
SUITES = {**{area: (area, ) for area in AREAS}, "all": AREAS}

CONFORMANCE_DIR = Path(__file__).resolve().parents[1] / "conformance"


class UnknownSuite(ValueError):
    pass


def area_of_module(filename):
    """The area a conformance module belongs to by its file name, or None."""
    stem = Path(filename).stem
    for area in AREAS:
        if stem == f"test_{area}" or stem.startswith(f"test_{area}_"):
            return area
    return None


def modules_for(suite, root=CONFORMANCE_DIR):
    """Conformance module paths a suite runs, sorted; UnknownSuite for a name not registered."""
    if suite not in SUITES:
        raise UnknownSuite(f"unknown suite {suite!r}; known suites: {', '.join(sorted(SUITES))}")
    areas = SUITES[suite]
    return sorted(path for path in Path(root).glob("test_*.py") if area_of_module(path) in areas)
