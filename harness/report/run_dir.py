"""Where runs land: reports/<run-id>/ by default, and reports/latest pointing at the newest run."""

import os
import secrets
import shutil
import time
from pathlib import Path

from harness.paths import REPORTS

# Tests point this elsewhere so that their runs do not move the repository's reports/latest.
REPORTS_ENV = "HARNESS_REPORTS_DIR"
OUT_ENV = "HARNESS_OUT"  # the run directory, for every check process of the run; its parts/: session/events.py


def reports_root():
    """Directory holding the runs and `latest`: $HARNESS_REPORTS_DIR if set (tests use it), else the repository's reports/."""
    return Path(os.environ.get(REPORTS_ENV) or REPORTS)


def new_run_id(suite, backend):
    """A run id unique per run and sortable by start (local time): `<YYYYmmddTHHMMSS>-<suite>-<backend>-<4 hex digits>`."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{suite}-{backend}-{secrets.token_hex(2)}"


def prepare(out):
    """Create the run directory, dropping parts a previous run left there."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "parts", ignore_errors=True)
    return out


def point_latest(out):
    """Make <reports>/latest a symlink to `out` (a copy where symlinks are not available)."""
    root = reports_root()
    root.mkdir(parents=True, exist_ok=True)
    latest = root / "latest"
    if latest.resolve() == Path(out).resolve():
        return latest
    target = os.path.relpath(out, root) if Path(out).resolve().is_relative_to(root.resolve()) else str(out)
    temporary = root / f".latest-{os.getpid()}"
    try:
        os.symlink(target, temporary, target_is_directory=True)
        if latest.is_dir() and not latest.is_symlink():
            shutil.rmtree(latest)
        os.replace(temporary, latest)  # atomic: readers see the old run or the new one
    except OSError:
        if latest.is_symlink() or latest.is_file():
            latest.unlink()
        elif latest.exists():
            shutil.rmtree(latest)
        shutil.copytree(out, latest)
    return latest
