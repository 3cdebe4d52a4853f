"""The JSON-lines event streams a run's sessions write as they go, and their one reader.

A check session (session/plugin.py) streams into <run dir>/parts/RESULTS_FILE, beside the session's facts in
SESSION_FILE and the checks its suite left out (with the reason) in LEFT_OUT_FILE; DeepSpeed's own test session
under `upstream` (upstream/upstream_plugin.py) into the file its runner names. One event per line
({"event": "collected" | "start" | "result" | ..., ...}), flushed per line, so a process that is killed still
leaves what it did; a line it cut short is skipped when read.
"""

import json
from pathlib import Path

RESULTS_FILE = "results.jsonl"
SESSION_FILE = "session.json"
LEFT_OUT_FILE = "left_out.json"


class EventStream:
    """Appends events to the JSON-lines file `path` (created if missing), each flushed as written."""

    def __init__(self, path):
        self._file = open(path, "a", encoding="utf-8")

    def emit(self, record):
        """Write `record` (a dict; values JSON cannot hold are written as their str()) as one line, flushed."""
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def close(self):
        """Close the file; later events are an error."""
        self._file.close()


def append_event(path, record):
    """Append one event to the stream at `path` from outside its session (the orchestrator, for a check whose
    process ended before it could)."""
    stream = EventStream(path)
    try:
        stream.emit(record)
    finally:
        stream.close()


def read_events(path):
    """The records of the event stream at `path`, in order; none when it does not exist. A line cut short by a
    killed process is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
