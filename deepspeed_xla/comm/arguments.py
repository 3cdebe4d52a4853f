"""Argument checks every collective of both transports makes before exchanging anything.

gloo and NCCL refuse a collective whose tensors do not fit together (list lengths, sizes,
dtypes) before any byte moves, so a misused call fails at once on every rank that can
see the mistake. Without these checks the host bridge would hand gloo buffers of
different sizes (one rank aborts with SIGABRT, another fails later on a reshape) and the
native transport would trace a collective whose shapes disagree across replicas. Each
check raises CollectiveError naming the rank, the group, the operation, what was
expected and what was got; `where` is the "rank R in group [...]: op" prefix of the group.
"""

from . import CollectiveError


def _shape(tensor):
    return f"({', '.join(map(str, tensor.shape))})"


def _fail(where, what):
    raise CollectiveError(f"{where}: {what}")


def same_dtype(where, tensors):
    """All tensors of one call share a dtype (gloo: "invalid tensor type")."""
    dtypes = [tensor.dtype for tensor in tensors]
    for index, dtype in enumerate(dtypes):
        if dtype != dtypes[0]:
            _fail(where, f"invalid tensor type at index {index} (expected {dtypes[0]}, got {dtype})")


def same_shape(where, tensors, like):
    """Every tensor has the shape and dtype of `like` (gloo: "invalid tensor size")."""
    for index, tensor in enumerate(tensors):
        if tensor.shape != like.shape:
            _fail(where, f"invalid tensor size at index {index} (expected {_shape(like)}, got {_shape(tensor)})")
        if tensor.dtype != like.dtype:
            _fail(where, f"invalid tensor type at index {index} (expected {like.dtype}, got {tensor.dtype})")


def one_per_rank(where, tensors, group_size, what="tensor list"):
    """A list with one tensor per rank of the group."""
    if len(tensors) != group_size:
        _fail(where, f"{what} must hold one tensor per rank (expected {group_size}, got {len(tensors)})")


def one_per_rank_like(where, tensors, like, group_size, what):
    """One tensor per rank, each with the shape and dtype of `like` (reduce_scatter's and scatter's inputs)."""
    one_per_rank(where, tensors, group_size, what)
    same_shape(where, tensors, like)


def per_rank_lists(where, tensor_lists, inputs, group_size):
    """all_gather / gather over lists: per input, one output per rank, each shaped like the input."""
    if len(tensor_lists) != len(inputs):
        _fail(where, f"expected one output list per input (expected {len(inputs)}, got {len(tensor_lists)})")
    for outputs, input in zip(tensor_lists, inputs):
        one_per_rank_like(where, outputs, input, group_size, "output list")


def flat_sizes(where, big, small, group_size, big_name, small_name):
    """`big` holds `group_size` times the elements of `small` (gathers into / scatters from one tensor)."""
    if big.numel() != small.numel() * group_size:
        _fail(where, f"{big_name} has {big.numel()} elements, expected {small.numel()} ({small_name}) x "
              f"{group_size} (group size)")
    if big.dtype != small.dtype:
        _fail(where, f"{big_name} is {big.dtype}, expected {small.dtype} (the {small_name}'s)")


def splits(where, tensor, sizes, group_size, name):
    """all_to_all_single: split sizes, one per rank, adding up to the tensor's first dimension;
    without sizes, a first dimension divisible by the group size."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if sizes:
        if len(sizes) != group_size:
            _fail(where, f"{name} split sizes must hold one size per rank (expected {group_size}, got {len(sizes)})")
        if sum(sizes) != rows:
            _fail(where, f"{name} split sizes add up to {sum(sizes)}, expected {rows} (the {name}'s first dimension)")
    elif rows % group_size:
        _fail(where, f"{name}'s first dimension {rows} does not split evenly over {group_size} ranks")


def all_to_all_single(where, output, input, output_split_sizes, input_split_sizes, group_size):
    """all_to_all_single: split sizes that fit each tensor, and one dtype."""
    splits(where, input, input_split_sizes, group_size, "input")
    splits(where, output, output_split_sizes, group_size, "output")
    same_dtype(where, [input, output])


def all_to_all(where, outputs, inputs, group_size):
    """all_to_all over lists: one input and one output per rank, all of one dtype."""
    one_per_rank(where, inputs, group_size, "input list")
    one_per_rank(where, outputs, group_size, "output list")
    same_dtype(where, [*inputs, *outputs])


def peer(where, peer_rank, own_rank, group_size):
    """Point to point: a peer in the group other than this rank."""
    if not 0 <= peer_rank < group_size:
        _fail(where, f"peer rank {peer_rank} is not in the group (size {group_size})")
    if peer_rank == own_rank:
        _fail(where, "a rank cannot send to or receive from itself")
