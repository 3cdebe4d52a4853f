"""DeepSpeed's device indices, read as the local XLA ordinal of this process.

DeepSpeed passes device indices as ints, as strings ('1', from environment variables and configs,
or 'xla:1') and as torch.device, and names a rank's device by its local rank, while each process
owns one XLA device, which it sees as ordinal 0.
"""

import os

import torch

from .backend import DEVICE_TYPE

_EXPECTED = f"expected an int, a string such as '1' or '{DEVICE_TYPE}:1', or a torch.device"


def ordinal(device_index, current, environ=os.environ):
    """The local XLA ordinal of `device_index` (None: `current`); the process's LOCAL_RANK maps to 0.

    ValueError names the index and the accepted forms when it is none of them, not an XLA
    device, or negative."""
    if device_index is None:
        return current
    index = device_index
    if isinstance(index, torch.device):
        if index.type != DEVICE_TYPE:
            raise ValueError(f"not an XLA device: {index}")
        index = index.index if index.index is not None else current
    elif isinstance(index, str):
        text = index.strip()
        if text == DEVICE_TYPE:
            return current
        text = text.removeprefix(f"{DEVICE_TYPE}:")
        if not text.isdigit():
            raise ValueError(f"not an XLA device index: {device_index!r} ({_EXPECTED})")
        index = int(text)
    elif isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"not an XLA device index: {device_index!r} ({_EXPECTED})")
    if index < 0:
        raise ValueError(f"device index must be >= 0, got {device_index!r}")
    local_rank = environ.get("LOCAL_RANK")
    if local_rank is not None and local_rank.isdigit() and index == int(local_rank):
        return 0
    return index
