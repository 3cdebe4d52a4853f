"""The native transport (TPU) traced on PJRT CPU: each collective lowers to the XLA op
with the right replica groups, reduction and scale. Nothing runs across processes
here; larger worlds are traced (lowered to HLO), never executed."""

import re

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceScatterOptions

from deepspeed_xla.backend import runtime
from deepspeed_xla.comm import CollectiveError
from deepspeed_xla.comm.native import XlaNativeProcessGroup, replica_groups


@pytest.mark.parametrize("ranks,world,expected", [
    ([0, 1, 2, 3], 4, [[0, 1, 2, 3]]),
    ([0, 1], 4, [[0, 1], [2, 3]]),
    ([1, 3], 4, [[1, 3], [0, 2]]),
    ([2], 4, [[2], [0], [1], [3]]),
    ([0, 1, 2], 4, [[0, 1, 2], [3]]),
])
def test_replica_groups_cover_the_world(ranks, world, expected):
    groups = replica_groups(ranks, world)
    assert groups == expected
    assert sorted(r for g in groups for r in g) == list(range(world))


def hlo_of(tensor):
    return runtime.traced_hlo([tensor])


def groups_in(hlo, op):
    found = re.findall(rf"{op}\(.*?replica_groups=(\{{[\d,{{}}]*\}})", hlo)
    assert found, f"no {op} in:\n{hlo}"
    return found


def opts(cls, op):
    o = cls()
    o.reduceOp = op
    return o


@pytest.fixture
def device(monkeypatch):
    # PyTorch/XLA skips an all-reduce when its own world has one device; this makes it
    # trace the op anyway (its own tests do the same).
    monkeypatch.setenv("XLA_ALWAYS_ALLREDUCE", "1")
    device = runtime.torch_device()
    # Traced collectives are chained through a per-device token; each test starts a new
    # chain (and drops the traced, never-run ops of worlds larger than this one).
    import torch_xla
    torch_xla._XLAC._set_all_reduce_token(str(device), None)
    yield device
    torch_xla._XLAC._set_all_reduce_token(str(device), None)


def test_all_reduce_on_one_device(device):
    pg = XlaNativeProcessGroup(0, 1, global_ranks=[0], world_size=1)
    t = torch.arange(4.0, device=device)
    pg.allreduce([t], opts(AllreduceOptions, dist.ReduceOp.MAX))
    hlo = hlo_of(t)
    assert groups_in(hlo, "all-reduce") == ["{{0}}"]
    assert "maximum(" in hlo
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0], "a one-rank all-reduce is the identity"


def test_avg_is_a_scaled_sum_over_the_subgroup(device):
    # Rank 3's view of the group [1, 3] in a world of 4: traced, never run.
    pg = XlaNativeProcessGroup(1, 2, global_ranks=[1, 3], world_size=4)
    t = torch.ones(4, device=device)
    pg.allreduce([t], opts(AllreduceOptions, dist.ReduceOp.AVG))
    hlo = hlo_of(t)
    assert groups_in(hlo, "all-reduce") == ["{{1,3},{0,2}}"]
    assert re.search(r"add\(", hlo) and re.search(r"constant\(0\.5\)", hlo), hlo


def test_reduce_scatter_all_gather_all_to_all(device):
    pg = XlaNativeProcessGroup(0, 2, global_ranks=[0, 1], world_size=4)
    out = torch.empty(2, device=device)
    pg._reduce_scatter_base(out, torch.ones(4, device=device), opts(ReduceScatterOptions, dist.ReduceOp.SUM))
    assert groups_in(hlo_of(out), "reduce-scatter") == ["{{0,1},{2,3}}"]
    gathered = torch.empty(8, device=device)
    pg._allgather_base(gathered, torch.ones(4, device=device))
    assert groups_in(hlo_of(gathered), "all-gather") == ["{{0,1},{2,3}}"]
    exchanged = torch.empty(4, device=device)
    pg.alltoall_base(exchanged, torch.ones(4, device=device), [], [], None)
    assert groups_in(hlo_of(exchanged), "all-to-all") == ["{{0,1},{2,3}}"]


def test_broadcast_from_a_group_relative_root(device):
    pg = XlaNativeProcessGroup(0, 2, global_ranks=[2, 3], world_size=4)
    t = torch.ones(3, device=device)
    o = BroadcastOptions()
    o.rootRank = 1  # global rank 3; this process (global 2) contributes zeros
    pg.broadcast([t], o)
    assert groups_in(hlo_of(t), "all-reduce") == ["{{2,3},{0,1}}"]


def test_unsupported_requests_name_rank_and_op(device):
    pg = XlaNativeProcessGroup(1, 2, global_ranks=[0, 1], world_size=2)
    with pytest.raises(CollectiveError, match=r"rank 1 in group \[0, 1\]: all_to_all_single\(uneven splits\)"):
        pg.alltoall_base(torch.empty(3, device=device), torch.ones(3, device=device), [1, 2], [2, 1], None)
    with pytest.raises(CollectiveError, match=r"rank 1 .*recv\(src=None\)"):
        pg.recv_anysource([torch.empty(1, device=device)], 0)


def test_subgroup_ranks_are_world_ranks_in_errors_and_point_to_point(device, monkeypatch):
    """c10d passes peers and roots relative to the group: a subgroup of world ranks [1, 3] names
    and pairs its members by their world ranks (the permute itself is not run here: one process)."""
    pg = XlaNativeProcessGroup(1, 2, global_ranks=[1, 3], world_size=4)
    with pytest.raises(CollectiveError, match=r"rank 3 in group \[1, 3\]: recv\(src=None\)"):
        pg.recv_anysource([torch.empty(1, device=device)], 0)
    pairs = []
    monkeypatch.setattr(runtime, "collective_permute", lambda tensor, pair: pairs.append(pair) or tensor)
    monkeypatch.setattr(runtime, "sync", lambda wait=True: None)
    t = torch.ones(2, device=device)
    pg.send([t], 0, 0)
    pg.recv([t], 0, 0)
    assert pairs == [[[3, 1]], [[1, 3]]]


def test_misused_collectives_are_refused_before_tracing(device):
    """Like the host bridge (and gloo): sizes and list lengths are checked before anything is traced."""
    pg = XlaNativeProcessGroup(1, 2, global_ranks=[0, 1], world_size=2)
    inp = torch.ones(4, device=device)
    with pytest.raises(CollectiveError, match=r"rank 1 in group \[0, 1\]: all_gather: invalid tensor size at index 1 "
                                              r"\(expected \(4\), got \(2\)\)"):
        pg.allgather([[torch.zeros(4, device=device), torch.zeros(2, device=device)]], [inp])
    with pytest.raises(CollectiveError, match=r"all_gather: output list must hold one tensor per rank "
                                              r"\(expected 2, got 3\)"):
        pg.allgather([[torch.zeros(4, device=device)] * 3], [inp])
    with pytest.raises(CollectiveError, match=r"all_gather_into_tensor: output has 7 elements, expected 4 \(input\) x 2"):
        pg._allgather_base(torch.zeros(7, device=device), inp)
    with pytest.raises(CollectiveError, match=r"reduce_scatter_tensor: input has 4 elements, expected 3 \(output\) x 2"):
        pg._reduce_scatter_base(torch.zeros(3, device=device), inp, opts(ReduceScatterOptions, dist.ReduceOp.SUM))
    with pytest.raises(CollectiveError, match=r"send: a rank cannot send to or receive from itself"):
        pg.send([inp], 1, 0)
    assert runtime.traced_hlo([inp]).count("all-gather") == 0
