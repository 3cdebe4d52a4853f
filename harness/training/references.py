"""Stored reference curves: fixtures/references/<backend>/<area>/<case>.json.

A training case's reference is the same script and config trained on DeepSpeed's CPU accelerator (or
the case's reference_config, where its own needs what that accelerator lacks). By default a check
computes it live, in the same run as the candidate. `--reference stored` uses the curve recorded by
`python -m harness references` (`tox -e reference`) instead, while it is fresh: recorded from the same
script and config bytes, the same case (ranks, steps, args) and the same torch and DeepSpeed. A stale
or missing curve is computed live, and the check's evidence says why. Losses are stored as JSON floats, which
round-trip exactly.
"""

import dataclasses
import datetime
import hashlib
import json
import platform
from pathlib import Path

from harness.atomic_files import write_text_atomically
from harness.environment import installed_version, source_revision
from harness.training.loss_comparison import compare_losses
from harness.paths import FIXTURES, REFERENCES, REPO
from harness.training.training import TrainingFailed

# A regenerated curve that moved by at most this fraction of its precision's rtol trained the same:
# CPUs of another model round fp32 differently (~1e-7 relative between the x86 CPUs seen here), and
# rewriting such a curve would only churn the stored files.
SAME_WITHIN = 0.1
BACKEND = "cpu"  # DeepSpeed's CPU accelerator; the layout leaves room for others (a CUDA reference)
MODES = ("live", "stored")
# `--reference`, as `python -m harness run` and the pytest plugin both take it.
REFERENCE_OPTION = {"choices": MODES, "default": "live",
                    "help": "CPU reference curves of the zero, pipeline and scripts cases: trained live in this run "
                            "(default), or stored in fixtures/references/ (used only where fresh for this stack)"}


@dataclasses.dataclass
class Reference:
    """The CPU reference loss curve (one float per step) of a training check: trained live or read from the stored `file`;
    `note` says why a stored curve was not used, `stored_max_rel_diff` is a live curve's largest relative step difference
    from a fresh stored one (compare_losses' max_rel_err)."""
    losses: list
    source: str  # "live" or "stored"
    file: str  # the stored file, relative to the repository (used or not)
    note: str = ""  # why a stored curve was not used
    stored_max_rel_diff: float | None = None  # live curve vs the fresh stored one: does it still reproduce here?

    def evidence(self):
        """The reference_* fields this reference adds to a check's evidence (report.json); note and max diff only when set."""
        return {"reference_source": self.source, "reference_file": self.file,
                **({"reference_note": self.note} if self.note else {}),
                **({"stored_max_rel_diff": self.stored_max_rel_diff} if self.stored_max_rel_diff is not None else {})}


def path_for(case, root=REFERENCES):
    """<root>/cpu/<case.area>/<case.id>.json: where the CPU reference curve of `case` is stored (may not exist yet)."""
    return Path(root) / BACKEND / case.area / f"{case.id}.json"


def _relative(path):
    path = Path(path).resolve()
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def provenance(case):
    """What the reference curve of `case` depends on: recorded with it, compared for freshness."""
    return {
        "case": {"script": case.script, "config": case.config, "ranks": case.ranks, "steps": case.steps,
                 "args": list(case.args),
                 **({"reference_ranks": case.reference_ranks} if case.reference_ranks is not None else {}),
                 **({"reference_config": case.reference_config} if case.reference_config is not None else {})},
        "sources": {name: _sha256(FIXTURES / name) for name in case.sources},
        "stack": {"torch": installed_version("torch"), "deepspeed": installed_version("deepspeed"),
                  "deepspeed_git": source_revision("deepspeed")},
    }


def staleness(stored, current):
    """Why a stored reference does not apply to `current` provenance; empty when it does."""
    reasons = []
    for field, value in current["case"].items():
        if stored["case"].get(field) != value:
            reasons.append(f"case {field} is {value!r}, recorded with {stored['case'].get(field)!r}")
    for name, digest in current["sources"].items():
        if stored["sources"].get(name) != digest:
            reasons.append(f"fixtures/{name} changed since it was recorded")
    for package, version in current["stack"].items():
        if stored["stack"].get(package) != version:
            reasons.append(f"{package} is {version}, recorded with {stored['stack'].get(package)}")
    return reasons


def load(case, root=REFERENCES):
    """(the stored record or None, reasons it cannot be used: missing, unreadable or stale)."""
    path = path_for(case, root)
    if not path.is_file():
        return None, [f"no stored reference ({_relative(path)}); `tox -e reference` records it"]
    try:
        stored = json.loads(path.read_text())
        reasons = staleness(stored, provenance(case))
        losses = stored["losses"]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return None, [f"{_relative(path)} is not a reference record ({type(err).__name__}: {err}); record it again"]
    if len(losses) != case.steps or not all(isinstance(x, float) for x in losses):
        reasons.append(f"{_relative(path)} holds {len(losses)} losses, the case trains {case.steps} steps")
    return stored, reasons


def record(case, losses, root=REFERENCES):
    """Write the reference curve of `case` with its provenance (atomically); returns the path."""
    path = path_for(case, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "area": case.area,
        "id": case.id,
        "backend": BACKEND,
        **provenance(case),
        "recorded_on": {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                        "machine": platform.machine(), "cpu": _cpu_model()},
        "losses": [float(x) for x in losses],
    }
    return write_text_atomically(path, json.dumps(data, indent=1) + "\n")


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def reference_for(case, mode, workdir, root=REFERENCES):
    """The reference curve of `case`: trained live on CPU, or (mode "stored") the stored one while fresh."""
    if mode not in MODES:
        raise ValueError(f"reference mode {mode!r}: expected one of {', '.join(MODES)}")
    file = _relative(path_for(case, root))
    stored, reasons = load(case, root)
    if mode == "stored" and not reasons:
        return Reference(losses=stored["losses"], source="stored", file=file)
    losses = case.run(None, workdir).losses
    if mode == "stored":
        return Reference(losses=losses, source="live", file=file, note="computed live: " + "; ".join(reasons))
    # a live run also measures how well the stored curve reproduces on this machine
    drift = None if reasons else compare_losses(stored["losses"], losses, case.precision)["max_rel_err"]
    return Reference(losses=losses, source="live", file=file, stored_max_rel_diff=drift)


def regenerate(cases, workdir, root=REFERENCES, say=print, recorded=None):
    """Record the CPU reference of every case (appending each to `recorded` as it is written);
    returns the cases that failed to train. Each line says how the new curve compares with the
    one it replaces."""
    failed, recorded = [], [] if recorded is None else recorded
    for case in cases:
        existed = path_for(case, root).is_file()
        before, reasons = load(case, root)
        try:
            run = case.run(None, Path(workdir) / case.area / case.id)
        except TrainingFailed as err:  # name it, keep recording the others
            failed.append(case)
            say(f"{case.area}/{case.id}: FAILED, nothing recorded: {err}")
            continue
        recorded.append(case)
        diff = compare_losses(before["losses"], run.losses, case.precision) if before is not None else None
        if diff is not None and not reasons and diff["ok"] and diff["max_rel_err"] <= SAME_WITHIN * diff["rtol"]:
            # rewriting only the recording date would turn every regeneration into a diff to review
            moved = "" if before["losses"] == run.losses else f", max rel change {diff['max_rel_err']:.2g}"
            say(f"{case.area}/{case.id}: unchanged ({_relative(path_for(case, root))}{moved})")
            continue
        path = record(case, run.losses, root)
        if before is None:
            change = "replaces an unreadable record" if existed else "new"
        else:
            change = (f"max rel change {diff['max_rel_err']:.2g} from the previous curve"
                      + (f" (was stale: {'; '.join(reasons)})" if reasons else ""))
        say(f"{case.area}/{case.id}: {len(run.losses)} losses -> {_relative(path)}; {change}")
    return failed
