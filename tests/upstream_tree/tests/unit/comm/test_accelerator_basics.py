"""One test per verdict the harness must tell apart (tests/test_harness_upstream.py names them)."""

import os
import signal
import time

import pytest
import torch
from deepspeed.accelerator import get_accelerator

from unit.common import DistributedTest


class TestDeviceArithmetic(DistributedTest):
    """Passes on any working accelerator."""
    world_size = 2

    def test_add(self):
        device = get_accelerator().current_device_name()
        total = torch.ones(3, device=device) + int(os.environ["RANK"])
        assert total.cpu().tolist() == [1.0 + int(os.environ["RANK"])] * 3


class TestRngState(DistributedTest):
    """Fails on a candidate whose RNG state is not the device generator's."""
    world_size = 1

    def test_restore_replays(self):
        accelerator = get_accelerator()
        device = accelerator.current_device_name()
        accelerator.manual_seed(7)
        state = accelerator.get_rng_state()
        first = torch.rand(4, device=device).cpu()
        accelerator.set_rng_state(state)
        assert torch.equal(torch.rand(4, device=device).cpu(), first)


class TestNeedsDevice(DistributedTest):
    """Skipped on DeepSpeed's CPU accelerator, as DeepSpeed's GPU-only tests are."""
    world_size = 1

    def test_not_on_cpu(self):
        if get_accelerator().device_name() == "cpu":
            pytest.skip("needs a device accelerator")
        assert get_accelerator().is_available()


class TestRankDies(DistributedTest):
    """A rank killed by a signal: DeepSpeed's pool never reports it."""
    world_size = 2

    @pytest.mark.world_size(2)
    def test_rank_killed(self):
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)


def test_hangs_when_asked():
    """Hangs in the session's own process when TREE_HANG is set (the watchdog's case). It comes before
    test_runs_in_the_session, so a session stopped here must resume for that one."""
    if os.environ.get("TREE_HANG"):
        time.sleep(3600)


def test_runs_in_the_session():
    """A plain test after the one whose rank died and the one that hangs: the run must go on to it."""
    assert torch.ones(2).sum().item() == 2.0
