"""A DistributedTest shaped like DeepSpeed's tests/unit/common.py, reduced to what the harness meets.

Each test's ranks run in a forkserver pool (cached per world size, as DeepSpeed's
`reuse_dist_env`); a rank that raises pytest.skip skips the test; ranks that do not answer
within DS_UNITTEST_TIMEOUT end the whole session with pytest.exit, as DeepSpeed's does. A
world larger than the accelerator's device_count() is skipped, and CUDA_VISIBLE_DEVICES is
required for an accelerator that is not CPU (DeepSpeed asks a vendor tool otherwise).
"""

import os

import pytest
import torch.multiprocessing as mp
from _pytest.outcomes import Skipped
from deepspeed.accelerator import get_accelerator

TIMEOUT = int(os.environ.get("DS_UNITTEST_TIMEOUT", "600"))


class DistributedTest:
    is_dist_test = True
    world_size = 2
    _pools = {}

    def __call__(self, item):
        marker = item.get_closest_marker("world_size")
        world_size = marker.args[0] if marker else self.world_size
        if get_accelerator().device_name() != "cpu":
            assert "CUDA_VISIBLE_DEVICES" in os.environ, "accelerator not known to DeepSpeed's test harness"
        if get_accelerator().device_count() < world_size:
            pytest.skip(f"{world_size} devices required, {get_accelerator().device_count()} available")
        mp.set_start_method("forkserver", force=True)
        pool = self._pools.setdefault(world_size, mp.Pool(world_size))
        args = [(type(self), item.originalname, rank, world_size) for rank in range(world_size)]
        pending = pool.starmap_async(_run_rank, args)
        try:
            skips = pending.get(TIMEOUT)
        except mp.TimeoutError:
            pytest.exit("Test hanged, exiting", returncode=1)
        if any(skips):
            pytest.skip(next(s for s in skips if s))


def _run_rank(cls, name, rank, world_size):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        getattr(cls(), name)()
    except Skipped as skip:
        return skip.msg
    return ""
