"""The HLO each collective lowers to on the candidate's XLA-native transport.

On TPU, DeepSpeed's collectives run as XLA collectives inside the step graph: a wrong replica
group reduces across the wrong ranks, silently. These checks build the candidate's process
group (the backend it names in communication_backend_name(), created the way torch.distributed
creates it) as rank r of a world of 4, call each collective DeepSpeed issues, and read the
traced HLO, which is never run: on PJRT CPU a world of 4 is traced from one process. Each
check names the HLO op, the reduction, the replica groups (the default group and subgroups,
whose other ranks must still be covered), the result shape and the dtype.

A candidate whose transport on this backend is not XLA-native (deepspeed_xla's host bridge on
PJRT CPU is selected by device; DS_XLA_COMM_TRANSPORT=native asks for its native one) has
nothing to lower: its group cannot be built without its peers, and the checks say so.
"""

import datetime
import re

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceOptions, AllToAllOptions, BroadcastOptions,
                                        ReduceScatterOptions, _DistributedBackendOptions)

from xla_probe import hlo, reset_collective_chain

pytestmark = pytest.mark.area("lowering")

WORLD = 4


@pytest.fixture
def native(monkeypatch, accel, xla_device):
    """group(rank, ranks): the candidate's process group as `rank` of group `ranks` in a world of 4."""
    monkeypatch.setenv("DS_XLA_COMM_TRANSPORT", "native")
    # torch_xla skips a collective when its own world has one device; trace it anyway (as its tests do).
    monkeypatch.setenv("XLA_ALWAYS_ALLREDUCE", "1")
    name = accel.communication_backend_name()
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is None:
        pytest.fail(f"communication_backend_name() is {name!r}, which is not registered with torch.distributed "
                    "(DeepSpeed's init_distributed could not create it)")
    reset_collective_chain(xla_device)
    timeout = datetime.timedelta(seconds=10)
    # The world of 4 this process is rank 1 of, as DeepSpeed's init_distributed makes it: subgroups
    # size their replica groups by it. A native transport needs no peers to build a group.
    if dist.is_initialized():
        pytest.fail("a process group is already initialised in the check process; the lowering checks need their own")
    try:
        dist.init_process_group(backend=name, store=dist.HashStore(), rank=1, world_size=WORLD, timeout=timeout)
    except (RuntimeError, TimeoutError) as err:  # a rendezvous that waited for peers (DistError is a RuntimeError)
        pytest.skip(f"backend {name!r} is not XLA-native here: building its group needed its peers ({err})")

    def group(group_rank, ranks):
        store = dist.HashStore()
        try:
            if plugin.extended_api:
                options = _DistributedBackendOptions()
                options.store, options.group_rank, options.group_size = store, group_rank, len(ranks)
                options.timeout, options.group_id, options.global_ranks_in_group = timeout, "lowering", list(ranks)
                return plugin.creator_fn(options, None)
            return plugin.creator_fn(store, group_rank, len(ranks), timeout)
        except (RuntimeError, TimeoutError) as err:
            pytest.skip(f"backend {name!r} is not XLA-native here: building its group needed its peers ({err})")

    yield group
    dist.destroy_process_group()
    reset_collective_chain(xla_device)


def reduce_opts(cls, op):
    opts = cls()
    opts.reduceOp = op
    return opts


def lowered(tensor, op):
    """(HLO text, [(replica groups, result type)] of each `op` instruction) behind `tensor`.

    A result type is the collective's first result (torch_xla threads an ordering token through
    its collectives as a second one), without its layout: `f32[4]`.
    """
    text = hlo([tensor])
    found = re.findall(rf"= (\(.*?\)|\S+) {op}\(.*?replica_groups=(\{{[\d,{{}}]*\}})", text)
    assert found, f"no {op} in the HLO behind the result; the candidate lowered it to:\n{text[-3000:]}"
    return text, [(groups, re.match(r"\(?(\w+\[[\d,]*\])", result).group(1)) for result, groups in found]


def same_groups(found, expected):
    """Replica groups equal as a partition: the same groups, in any order, each with the same ranks in
    any order (XLA does not order them)."""
    parse = lambda text: sorted(sorted(int(r) for r in group.split(",")) for group in re.findall(r"\{([\d,]+)\}", text))
    return parse(found) == parse(expected)


def numel(hlo_type):
    """Elements of an HLO array type such as f32[4,2]."""
    count = 1
    for dim in re.findall(r"\d+", hlo_type.split("[", 1)[1]):
        count *= int(dim)
    return count


def reduction_of(text, op):
    """The instruction the first `op`'s to_apply computation ends in (add, maximum, ...)."""
    name = re.search(rf" {op}\(.*?to_apply=%?([\w.]+)", text).group(1)
    body = text[text.index(f"%{name} ("):]
    return re.search(r"ROOT \S+ = \S+ ([\w-]+)\(", body).group(1)


@pytest.mark.parametrize("op, reduction", [(dist.ReduceOp.SUM, "add"), (dist.ReduceOp.MAX, "maximum"),
                                           (dist.ReduceOp.MIN, "minimum")], ids=["sum", "max", "min"])
def test_all_reduce_default_group(native, xla_device, op, reduction, evidence):
    tensor = torch.ones(4, device=xla_device)
    native(1, range(WORLD)).allreduce([tensor], reduce_opts(AllreduceOptions, op))
    text, found = lowered(tensor, "all-reduce")
    evidence.update(lowered=found)
    assert same_groups(found[0][0], "{{0,1,2,3}}") and found[0][1] == "f32[4]", \
        f"all_reduce over the world of {WORLD} lowered to {found}"
    assert reduction_of(text, "all-reduce") == reduction, f"ReduceOp.{op} must reduce with {reduction}"


def test_all_reduce_avg_is_a_sum_scaled_by_the_group_size(native, xla_device, evidence):
    tensor = torch.ones(4, device=xla_device)
    native(0, [1, 3]).allreduce([tensor], reduce_opts(AllreduceOptions, dist.ReduceOp.AVG))
    text, found = lowered(tensor, "all-reduce")
    evidence.update(lowered=found)
    assert same_groups(found[0][0], "{{1,3},{0,2}}"), f"AVG over the subgroup [1, 3] lowered to replica groups {found[0][0]}"
    assert reduction_of(text, "all-reduce") == "add" and re.search(r"constant\(0\.5\)", text), \
        "AVG over 2 ranks must be a sum scaled by 1/2"


@pytest.mark.parametrize("ranks, expected", [([0, 1], "{{0,1},{2,3}}"), ([2, 3], "{{2,3},{0,1}}"),
                                             ([0, 2], "{{0,2},{1,3}}")], ids=["01", "23", "02"])
def test_all_reduce_subgroup(native, xla_device, ranks, expected, evidence):
    """DeepSpeed's data-, model- and pipeline-parallel groups: the group is one replica group and the
    other ranks are covered by groups of the same size."""
    tensor = torch.ones(2, 3, device=xla_device)
    native(1, ranks).allreduce([tensor], reduce_opts(AllreduceOptions, dist.ReduceOp.SUM))
    _, found = lowered(tensor, "all-reduce")
    evidence.update(lowered=found)
    assert same_groups(found[0][0], expected) and found[0][1] == "f32[2,3]", \
        f"all_reduce over the subgroup {ranks} lowered to {found}"


def test_all_reduce_keeps_bf16(native, xla_device, evidence):
    tensor = torch.ones(8, dtype=torch.bfloat16, device=xla_device)
    native(0, range(WORLD)).allreduce([tensor], reduce_opts(AllreduceOptions, dist.ReduceOp.SUM))
    _, found = lowered(tensor, "all-reduce")
    evidence.update(lowered=found)
    assert found[0][1] == "bf16[8]", f"a bf16 all_reduce lowered to {found[0][1]}: gradients would change precision"


def test_reduce_scatter_tensor(native, xla_device, evidence):
    out = torch.empty(2, device=xla_device)
    native(1, [0, 1])._reduce_scatter_base(out, torch.ones(4, device=xla_device),
                                           reduce_opts(ReduceScatterOptions, dist.ReduceOp.SUM))
    text, found = lowered(out, "reduce-scatter")
    evidence.update(lowered=found)
    assert same_groups(found[0][0], "{{0,1},{2,3}}") and found[0][1] == "f32[2]", \
        f"reduce_scatter_tensor over [0, 1] lowered to {found}"
    assert reduction_of(text, "reduce-scatter") == "add"


def test_all_gather_into_tensor(native, xla_device, evidence):
    """ZeRO-3's parameter gather: each rank's shard, concatenated in rank order."""
    out = torch.empty(8, device=xla_device)
    native(0, range(WORLD))._allgather_base(out, torch.ones(2, device=xla_device), AllgatherOptions())
    _, found = lowered(out, "all-gather")
    evidence.update(lowered=found)
    assert same_groups(found[0][0], "{{0,1,2,3}}") and numel(found[0][1]) == 8, \
        f"all_gather_into_tensor lowered to {found}"


def test_all_to_all_single(native, xla_device, evidence):
    out = torch.empty(4, device=xla_device)
    native(0, [2, 3]).alltoall_base(out, torch.ones(4, device=xla_device), [], [], AllToAllOptions())
    _, found = lowered(out, "all-to-all")
    evidence.update(lowered=found)
    assert same_groups(found[0][0], "{{2,3},{0,1}}"), f"all_to_all_single over [2, 3] lowered to {found}"


def test_broadcast_from_a_group_relative_root(native, xla_device, evidence):
    """The root is given relative to the group (torch.distributed translates DeepSpeed's global src)."""
    tensor = torch.ones(3, device=xla_device)
    opts = BroadcastOptions()
    opts.rootRank = 1
    native(0, [2, 3]).broadcast([tensor], opts)
    text = hlo([tensor])
    groups = re.findall(r"replica_groups=(\{[\d,{}]*\})", text)
    pairs = re.findall(r"source_target_pairs=(\{[\d,{}]*\})", text)
    evidence.update(replica_groups=groups, source_target_pairs=pairs)
    assert any(same_groups(g, "{{2,3},{0,1}}") for g in groups) or "{{3,2}}" in pairs, (
        f"broadcast in the subgroup [2, 3] from its rank 1 (global 3) lowered to replica groups {groups} and "
        f"source/target pairs {pairs}")
