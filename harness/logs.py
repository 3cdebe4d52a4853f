"""Reading what a run's log says went wrong."""

import re

_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")


def last_error_line(log):
    """The last `SomeError: message` line of a log (rank prefixes dropped, cut to 300 characters),
    so the first line of a failure says what went wrong; None when there is none."""
    for line in reversed(log.splitlines()):
        match = _ERROR_LINE.match(line.strip())
        if match:
            return match.group(1)[:300]
    return None


def tail(log, lines=25):
    """The last `lines` lines of a log."""
    return "\n".join(log.strip().splitlines()[-lines:])


def last_line(log):
    """The last non-blank line of a log, stripped ('' for none): where a command that fails in one line says why."""
    return next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "")
