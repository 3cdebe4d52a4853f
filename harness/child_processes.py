"""Stopping a child and everything it started: the harness starts each child in a session of its
own, so its ranks, launchers and multiprocessing pools share the child's process group."""

import contextlib
import ctypes
import os
import signal
import subprocess
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork: the child only calls it


def dies_with_parent():
    """preexec_fn for subprocess.Popen (Linux): the child gets SIGKILL when the thread that started it
    ends (its process exiting, however it exits: a SIGKILL included)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def terminated_with_parent():
    """preexec_fn for subprocess.Popen (Linux): the child gets SIGTERM when the thread that started it
    ends, a SIGKILL of its process included. For session_leader.py, which answers it by killing its
    process group."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def interrupted_with_parent():
    """preexec_fn for subprocess.Popen (Linux): the child gets SIGINT when the thread that started it
    ends, a SIGKILL of its process included. For a child that stops what it started on a Ctrl-C
    (pytest: its workers end their checks, whose launchers kill their ranks), where a SIGKILL would
    leave all that running."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGINT)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def interrupts_raise():
    """Make a Ctrl-C and a SIGTERM raise KeyboardInterrupt in this process (main thread), so that an entry
    point stops the way it does for a Ctrl-C: children stopped, what was finished written down.

    A cancelled CI job gets SIGTERM. A process started with SIGINT ignored (a background job of a shell
    script) would ignore Ctrl-C and pass the ignoring on to every child; a handler of our own is reset to
    the default in each child started.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def stop(process, first=signal.SIGTERM, wait_s=10):
    """Send `first` to the child's process group, SIGKILL it after wait_s; the child's exit status.

    Members that outlive the leader (pool workers, orphaned ranks) are killed as well.
    """
    for sig, timeout in ((first, wait_s), (signal.SIGKILL, 30)):
        _signal_group(process.pid, sig)
        try:
            process.wait(timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    _signal_group(process.pid, signal.SIGKILL)
    return process.returncode


def stop_interrupted(process, wait_s=10):
    """After a Ctrl-C or SIGTERM here: forward it to the child's group as SIGINT (the child ends what it
    was doing and says so), SIGKILL after wait_s, or at once if asked again; the child's exit status."""
    try:
        return stop(process, first=signal.SIGINT, wait_s=wait_s)
    except KeyboardInterrupt:  # asked twice: stop now
        return stop(process, first=signal.SIGKILL)


@contextlib.contextmanager
def interrupts_held(signals=(signal.SIGINT, signal.SIGTERM)):
    """Hold each of `signals` whose handler is Python's (Ctrl-C's KeyboardInterrupt, the harness's
    SIGTERM) until the block ends, then run the handler of the first that arrived. Starting a child
    inside the block (`proc = Popen(...)`) can then not be interrupted between the fork and `proc`
    being set, where the caller could no longer stop what it started. When the block raises, a held
    interrupt still runs, and its exception (KeyboardInterrupt) replaces the block's. Outside the main
    thread, where handlers cannot be changed, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    previous = {sig: signal.getsignal(sig) for sig in signals}
    held = [sig for sig, handler in previous.items() if callable(handler)]
    for sig in held:
        signal.signal(sig, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for sig in held:
            signal.signal(sig, previous[sig])
        if arrived:
            previous[arrived[0]](arrived[0], None)


def reap(process):
    """Kill what a finished child left running in its group (it must have exited)."""
    _signal_group(process.pid, signal.SIGKILL)


def how_it_ended(returncode):
    """'exit status 3' or 'signal 6 (SIGABRT)' for a child's return code (-N: killed by signal N)."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"signal {-returncode} ({signal.Signals(-returncode).name})"
    except ValueError:
        return f"signal {-returncode}"


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
