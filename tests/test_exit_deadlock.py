"""A process exits while steps that released host buffers adopted by the device are still running: the exit
deadlock at torch_xla's exit handler on PJRT CPU (deepspeed_xla/backend/runtime.py to_device)."""

import os
import subprocess
import sys
import textwrap

# Three steps of what the host bridge does with a collective's result: a host tensor made in Python, put on the
# device, copied into the caller's tensor, then a step long enough to be still running when the next one is
# queued. Each step's asynchronous execution releases the previous step's input buffers on an XLA thread.
# Then the exit: torch_xla's exit handler waits for the device with the GIL held.
EXIT_AFTER_PENDING_STEPS = textwrap.dedent("""
    import os, sys, torch, torch_xla
    import torch.utils.dlpack
    from deepspeed_xla.backend import runtime

    ADOPT = {
        "to_device": runtime.to_device,
        # how to_device adopted host tensors before: the Python-owned host tensor itself
        "python_owned": lambda host, device: torch_xla._XLAC._from_dlpack(torch.utils.dlpack.to_dlpack(host)),
    }[os.environ["ADOPT"]]
    device = torch_xla.device()
    target, weights = torch.zeros(1024, 1024).to(device), torch.randn(1024, 1024).to(device)
    torch_xla.sync()
    for step in range(3):
        result = torch.randn(1024, 1024)
        target.copy_(ADOPT(result, device))
        del result
        update = target
        for _ in range(30):
            update = torch.tanh(update @ weights)
        target.add_(update)
        del update
        torch_xla.sync(wait=False)
    print("steps queued", file=sys.stderr, flush=True)
""")
EXIT_GRACE_S = 30  # the exit itself takes about 1 s after the steps are queued


def _exit_after_pending_steps(adopt):
    """Whether a process whose last steps are still running on the device exits: (exited, stderr tail)."""
    env = dict(os.environ, PJRT_DEVICE="CPU", ADOPT=adopt)
    proc = subprocess.Popen([sys.executable, "-c", EXIT_AFTER_PENDING_STEPS], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stderr:  # to the end of the steps, however slow the machine
            lines.append(line)
            if line.startswith("steps queued"):
                break
        assert lines and lines[-1].startswith("steps queued"), f"the steps failed:\n{''.join(lines)[-3000:]}"
        try:
            proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            return False, "".join(lines)[-2000:]
        return proc.returncode == 0, "".join(lines + [proc.stderr.read()])[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        proc.stderr.close()


def test_process_exits_while_steps_that_released_adopted_buffers_are_pending():
    """A run that trained to the end and never exited: XLA released a buffer adopted from a Python-owned host
    tensor on its own thread, which then needed the GIL, held by the main thread in torch_xla's exit handler,
    waiting for that same execution. runtime.to_device hands XLA a copy made in C++, which needs no GIL."""
    exited, log = _exit_after_pending_steps("to_device")
    assert exited, (f"the process did not exit within {EXIT_GRACE_S} s of queueing its last steps (an XLA thread "
                    f"releasing a device buffer waits for the GIL held by the exit handler):\n{log}")


def test_python_owned_adopted_buffers_deadlock_the_exit():
    # The control for the test above: the same steps with the adoption to_device replaced deadlock every time,
    # so that the test above can fail.
    exited, log = _exit_after_pending_steps("python_owned")
    assert not exited, f"the steps with Python-owned adopted buffers exited; the exit test above proves nothing:\n{log}"
