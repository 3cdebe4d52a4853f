"""The XLA random generator, in the shape DeepSpeed expects of a torch.Generator.

An XLA device's whole RNG state is one 64-bit running seed, advanced by every random
op. DeepSpeed checkpoints and restores RNG state as a ByteTensor (activation
checkpointing replays dropout with it), so the seed travels as its 8 little-endian
bytes.
"""

import torch

from . import runtime

_SEED_BYTES = 8


def seed_to_state(seed):
    data = int(seed).to_bytes(_SEED_BYTES, "little", signed=False)
    return torch.tensor(list(data), dtype=torch.uint8)


def state_to_seed(state):
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != _SEED_BYTES:
        raise ValueError(f"an XLA RNG state is a uint8 tensor of {_SEED_BYTES} bytes (from get_rng_state()), "
                         f"got {getattr(state, 'dtype', type(state).__name__)} of {getattr(state, 'numel', lambda: '?')()} elements")
    return int.from_bytes(bytes(state.cpu().tolist()), "little", signed=False)


class XlaGenerator:
    """torch.Generator-like view of one XLA device's RNG."""

    def __init__(self, device):
        self.device = device
        self._initial_seed = runtime.get_rng_seed(device)

    def get_state(self):
        return seed_to_state(runtime.get_rng_seed(self.device))

    def set_state(self, state):
        runtime.set_rng_seed(state_to_seed(state), self.device)
        return self

    def manual_seed(self, seed):
        self._initial_seed = int(seed)
        runtime.set_rng_seed(seed, self.device)
        return self

    def initial_seed(self):
        return self._initial_seed

    def seed(self):
        seed = torch.seed()
        self.manual_seed(seed)
        return seed
