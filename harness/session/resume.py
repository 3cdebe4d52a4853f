"""Run a pytest session again on the checks a session collected but never ran: the loop the conformance run
(commands/run.py: a check that ended its process) and DeepSpeed's test sessions under `upstream`
(upstream/upstream_run.py: a test the watchdog stopped, a rank that died) share."""


def run_until_every_check_ran(run_session, targets):
    """Call `run_session(pending)` with `targets`, then with the checks the last session collected that are not yet
    accounted for, until none is left or a session says to stop. `run_session` returns (the node ids it collected,
    or None when it collected nothing; the node ids accounted for so far: with a result, or recorded as lost; whether
    to go on). Returns True when it ended because every collected check was accounted for.

    A session that goes on must account for at least one check it was given, or the loop would not end: a session
    that lost none (it ended for another reason) says to stop."""
    pending = list(targets)
    while pending:
        collected, accounted, go_on = run_session(pending)
        if not go_on or collected is None:
            return False
        pending = [nodeid for nodeid in collected if nodeid not in accounted]
    return True
