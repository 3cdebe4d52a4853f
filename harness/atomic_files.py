"""Files written whole or not at all: a reader (the report, another worker) never sees half of one."""

import os
from pathlib import Path


def write_text_atomically(path, text):
    """Write `text` (UTF-8) to `path` through a scratch file beside it, renamed over `path` in one step: readers
    see the old content or the new, and a write that fails (or is interrupted) leaves `path` as it was and no
    scratch file behind. The scratch name carries the process id, so several processes may write the same path
    at once (the last rename wins). Returns `path`."""
    path = Path(path)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        scratch.write_text(text, encoding="utf-8")
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
    return path
