"""The leader of a launch's session: runs one command (DeepSpeed's launcher) in its own process group,
and kills that whole group when the process that started it dies.

`run_in_session` kills a launch's session whatever way the launch ends, but only while the process
that called it lives. A check process killed on its own (the OOM killer picking a pytest worker)
runs no cleanup, and DeepSpeed's single-node runner does not pass a signal on to its `launch.py`,
so the launcher and its ranks ran on unwatched (a parent-death signal reaches one process, not its
descendants). This leader is started with a parent-death signal (SIGTERM), and answers it by
SIGKILLing its process group: the launcher, its ranks, their pools, and itself.

Run as a script, `python session_leader.py PARENT_PID COMMAND...`, by path: it imports only the
standard library. It exits as the command did: with its exit status, or killed by the same signal.
"""

import os
import signal
import subprocess
import sys


def _end_session(signum=None, frame=None):
    os.killpg(0, signal.SIGKILL)


def main(argv):
    """Run `argv[1:]` under parent PID `argv[0]`; return its exit status, or die by the signal that killed it."""
    parent, command = int(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _end_session)
    # A Ctrl-C sent to the group is the command's to answer: the leader waits for its exit status.
    # (A handler, not SIG_IGN, which the command would inherit.)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    if os.getppid() != parent:  # the parent died before the handler was set: its signal came too early
        _end_session()
    returncode = subprocess.Popen(command).wait()
    if returncode < 0:  # end as the command did, so the caller sees the same signal
        if -returncode != signal.SIGKILL:
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
