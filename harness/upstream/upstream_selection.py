"""Which of DeepSpeed's own unit tests `python -m harness upstream` runs, and their known differences.

A selection is a TOML file, fixtures/upstream/deepspeed-<version>.toml for the DeepSpeed
release line it was chosen for:

    deepspeed = "0.19.8"

    [[tests]]
    path = "unit/comm/test_dist.py"        # relative to the checkout's tests/ (DeepSpeed's rootdir)
    ids = ["TestInit", "TestDistAllReduce"] # optional: only these node ids under path (path::id)
    why = "what the file exercises"         # optional
    pr = true                               # optional: also in the pull-request subset (`--subset pr`)
    marks = "inference_ops"                 # optional: run in a session of its own with `-m marks`, in place
                                            # of DeepSpeed's default (pytest.ini's addopts leave out tests marked
                                            # sequential, nightly, inference_ops, ...; DeepSpeed's CI runs those
                                            # in sessions of their own the same way)

    [[known]]                               # a difference of the candidate from the baseline
    id = "unit/comm/test_dist.py::TestDistInit::*"   # `*` matches anything
    reason = "why"
    link = "https://github.com/... (issue tracking it)"
    fp16 = true                             # optional: a test of fp16, which XLA devices do not compute

Known entries are expectations (expectations.py): a regression they match is reported as an
expected failure, a matched test that passes is reported as such, and an entry matching no
test is reported. A `tests` entry whose targets collect no test on either side is reported too.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import tomllib

from harness.session.expectations import Expectation
from harness.paths import UPSTREAM_SELECTIONS
from harness.upstream.upstream_plugin import covered


SUBSETS = ("all", "pr")


class SelectionError(ValueError):
    """A malformed or missing selection file (bad usage)."""


@dataclass(frozen=True)
class Entry:
    """One [[tests]] entry: a test file `path` relative to DeepSpeed's tests/, optionally only the node `ids` under it,
    `why` it is selected, whether the pull-request subset runs it (`pr`), and the pytest marker expression its session
    runs with (`marks`; "" for DeepSpeed's default)."""
    path: str
    ids: tuple = ()
    why: str = ""
    pr: bool = False
    marks: str = ""

    @property
    def targets(self):
        """pytest arguments for this entry, relative to DeepSpeed's tests/ directory."""
        return [f"{self.path}::{node}" for node in self.ids] if self.ids else [self.path]

    @property
    def label(self):
        """How reports name the entry: `path`, or `path (id, id, ...)` when it selects ids."""
        return f"{self.path} ({', '.join(self.ids)})" if self.ids else self.path

    def covers(self, nodeid):
        """Whether pytest node id `nodeid` is one of this entry's targets or lies under one (`target::...`, `target[...]`)."""
        return covered(nodeid, self.targets)


@dataclass(frozen=True)
class Selection:
    """A loaded selection file: its `path`, the DeepSpeed version it was chosen for, its [[tests]] `entries`, its [[known]]
    differences as Expectations, and those of them marked fp16 (`fp16_known`)."""
    path: Path
    deepspeed: str
    entries: tuple
    known: tuple
    fp16_known: tuple = ()
    subset: str = "all"

    @property
    def targets(self):
        """The pytest arguments of every entry, in file order (relative to DeepSpeed's tests/ directory)."""
        return [target for entry in self.entries for target in entry.targets]

    def only(self, subset):
        """This selection with the entries of `subset` (SUBSETS: "all", or "pr", the entries marked pr)."""
        if subset not in SUBSETS:
            raise SelectionError(f"subset {subset!r}: use one of {', '.join(SUBSETS)}")
        if subset == "all":
            return self
        entries = tuple(entry for entry in self.entries if entry.pr)
        if not entries:
            raise SelectionError(f"{self.path}: no [[tests]] entry has pr = true (the pull-request subset is empty)")
        return dataclasses.replace(self, entries=entries, subset=subset)

    def sessions(self, missing=()):
        """[(marks, targets)]: the targets of the entries whose path is not in `missing`, one group per marker
        expression (DeepSpeed's default, "", first), each in file order; a side runs a pytest session per group."""
        groups = {"": []}
        for entry in self.entries:
            if entry.path not in missing:
                groups.setdefault(entry.marks, []).extend(entry.targets)
        return [(marks, targets) for marks, targets in groups.items() if targets]

    def stale_entries(self, nodeids):
        """Entries none of whose targets produced a test in `nodeids` (renamed or removed upstream)."""
        return [entry for entry in self.entries if not any(entry.covers(nodeid) for nodeid in nodeids)]

    def missing_files(self, tests_dir):
        """Paths of entries whose test file does not exist under `tests_dir` (removed or renamed in that checkout)."""
        return [entry.path for entry in self.entries if not (Path(tests_dir) / entry.path).is_file()]


def default_path(deepspeed_version):
    """fixtures/upstream/deepspeed-<deepspeed_version>.toml, the selection `upstream` reads without --selection."""
    return UPSTREAM_SELECTIONS / f"deepspeed-{deepspeed_version}.toml"


def available():
    """Sorted file names of the selections stored in fixtures/upstream/ (deepspeed-*.toml)."""
    return sorted(path.name for path in UPSTREAM_SELECTIONS.glob("deepspeed-*.toml"))


def _flag(entry, key, where):
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise SelectionError(f"{where}: {key} must be true or false")
    return value


def _strings(value, where):
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise SelectionError(f"{where}: ids must be a list of non-empty strings")
    return tuple(value)


def load(path):
    """The Selection in `path`; SelectionError with a one-line reason otherwise."""
    path = Path(path)
    if not path.is_file():
        raise SelectionError(f"selection file {path} does not exist (available: {', '.join(available()) or 'none'})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SelectionError(f"{path}: not valid TOML: {err}") from None
    entries = []
    for number, entry in enumerate(data.get("tests", []), 1):
        where = f"{path}: tests #{number}"
        if not str(entry.get("path", "")).strip():
            raise SelectionError(f"{where} lacks path")
        if Path(entry["path"]).is_absolute() or ".." in Path(entry["path"]).parts:
            raise SelectionError(f"{where}: path must be relative to DeepSpeed's tests/ directory")
        marks = entry.get("marks", "")
        if not isinstance(marks, str):
            raise SelectionError(f"{where}: marks must be a pytest marker expression (a string)")
        entries.append(Entry(entry["path"], _strings(entry.get("ids", []), where), entry.get("why", ""),
                             _flag(entry, "pr", where), marks.strip()))
    if not entries:
        raise SelectionError(f"{path}: selects no tests (add [[tests]] entries with a path)")
    known, fp16 = [], []
    for number, entry in enumerate(data.get("known", []), 1):
        missing = [key for key in ("id", "reason", "link") if not str(entry.get(key, "")).strip()]
        if missing:
            raise SelectionError(f"{path}: known #{number} lacks {', '.join(missing)} (id, reason and link are required)")
        known.append(Expectation(entry["id"], entry["reason"], entry["link"]))
        if _flag(entry, "fp16", f"{path}: known #{number}"):
            fp16.append(known[-1])
    return Selection(path, str(data.get("deepspeed", "")), tuple(entries), tuple(known), tuple(fp16))
