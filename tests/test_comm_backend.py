"""Units of the `xla_ds` backend that need no second rank: transport choice, timeouts,
registration, and what a one-rank world does."""

import datetime
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from deepspeed_xla import comm


@pytest.mark.parametrize("kind,expected", [("CPU", "bridge"), ("cpu", "bridge"), ("TPU", "native"),
                                           ("GPU", "native"), ("CUDA", "native")])
def test_transport_follows_device_kind(kind, expected):
    assert comm.transport_for(kind, {}) == expected


def test_transport_can_be_forced():
    assert comm.transport_for("TPU", {comm.TRANSPORT_ENV: "bridge"}) == "bridge"
    with pytest.raises(ValueError, match="expected 'bridge' or 'native'"):
        comm.transport_for("CPU", {comm.TRANSPORT_ENV: "nccl"})


def test_transport_choice_does_not_start_the_runtime():
    # In a fresh process: this one may have started the runtime for other tests.
    code = ("from xla_host import discovery\nfrom deepspeed_xla import comm\nfrom deepspeed_xla.backend import runtime\n"
            "print(comm.transport_for(discovery.device_type()), runtime.is_initialized())")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PJRT_DEVICE="CPU"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["bridge", "False"], (
        f"expected the host bridge chosen without starting the runtime, got {proc.stdout!r}")


def test_collective_timeout():
    default = datetime.timedelta(minutes=10)
    assert comm.collective_timeout(default, {}) == default
    assert comm.collective_timeout(default, {comm.TIMEOUT_ENV: "2.5"}) == datetime.timedelta(seconds=2.5)
    for bad in ("soon", "0", "-1"):
        with pytest.raises(ValueError, match=comm.TIMEOUT_ENV):
            comm.collective_timeout(default, {comm.TIMEOUT_ENV: bad})


def test_registered_with_the_extended_api():
    comm.register_backend()
    comm.register_backend()  # idempotent
    assert comm.BACKEND_NAME in dist.Backend.backend_list
    assert dist.Backend._plugins[comm.BACKEND_NAME.upper()].extended_api


class _Options:
    group_size = 2
    group_rank = 1
    global_ranks_in_group = [1, 3]
    timeout = datetime.timedelta(seconds=30)
    store = None


def test_process_group_on_tpu_is_native_with_global_ranks(monkeypatch):
    from deepspeed_xla.comm.native import XlaNativeProcessGroup
    from xla_host import discovery
    monkeypatch.setattr(discovery, "device_type", lambda: "TPU")
    monkeypatch.setenv(comm.TIMEOUT_ENV, "7")
    group = comm._create_process_group(_Options())
    assert isinstance(group, XlaNativeProcessGroup)
    assert group._global_ranks == [1, 3] and group.rank() == 1 and group.size() == 2
    assert group.timeout == datetime.timedelta(seconds=7)


@pytest.mark.parametrize("peer_seq,peer_op,expected", [
    (5, "all_reduce(op=SUM)", "waits in the same call"),
    (4, "all_reduce(op=SUM)", "is at #4 all_reduce(op=SUM)"),
    (5, "barrier", "is at #5 barrier, where this rank called all_reduce(op=SUM)"),
], ids=["same-call", "behind", "different-collective"])
def test_a_failure_says_where_each_peer_is(peer_seq, peer_op, expected):
    from deepspeed_xla.comm.bridge import _peer_state
    assert _peer_state(peer_seq, peer_op, 5, "all_reduce(op=SUM)") == expected


def test_only_a_host_bridge_group_of_several_ranks_reads_on_host(monkeypatch):
    """The step cuts its graph before a gradient reduction only where the host bridge will read the gradients:
    never without a process group, on a TPU's native group, or in a bridge group of one rank (which exchanges
    nothing). A two-rank bridge group reads (tests/test_step_graphs.py, the flattening and output-size tests)."""
    from deepspeed_xla.comm.bridge import HostBridgeProcessGroup
    from xla_host import discovery
    assert not comm.reads_on_host()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(discovery, "device_type", lambda: "TPU")
    assert not comm.reads_on_host(comm._create_process_group(_Options()))
    alone = HostBridgeProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    assert not comm.reads_on_host(alone)
