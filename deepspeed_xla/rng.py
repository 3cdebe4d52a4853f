"""The XLA random generator, in the shape DeepSpeed expects of a torch.Generator.

torch_xla keeps two 64-bit seeds per device: the running seed, advanced by every random op,
and the step's base seed, from which each sync derives the next step's seeds. Setting the
running seed (the only setter torch_xla has) resets the base seed too, so restoring a state
in the middle of a step, as activation checkpointing does twice in every recomputation,
would send every later step down another random stream. The state is therefore both seeds,
as 16 little-endian bytes (a ByteTensor, as DeepSpeed stores RNG states): restoring it sets
the running seed at once and, when the base differs, puts the base back at the next sync,
where torch_xla would otherwise derive the next step from the wrong one. An 8-byte state
(the running seed alone, as earlier versions of this package wrote) restores both seeds to
it.
"""

import torch

from .backend import runtime

_SEED_BYTES = 8


def seeds_to_state(base, running):
    """State of two seeds: a uint8 CPU tensor of 16 bytes, base then running seed, each 64-bit little-endian unsigned.
    Raises OverflowError for a seed that is negative or does not fit 64 bits."""
    data = b"".join(int(seed).to_bytes(_SEED_BYTES, "little", signed=False) for seed in (base, running))
    return torch.tensor(list(data), dtype=torch.uint8, device="cpu")  # zero.Init redirects bare constructors


def state_to_seeds(state):
    """(base seed, running seed) of a state from get_state(); an 8-byte state gives both as one."""
    if (not isinstance(state, torch.Tensor) or state.dtype != torch.uint8
            or state.numel() not in (_SEED_BYTES, 2 * _SEED_BYTES)):
        raise ValueError(f"an XLA RNG state is a uint8 tensor of {2 * _SEED_BYTES} bytes (from get_rng_state()), "
                         f"got {getattr(state, 'dtype', type(state).__name__)} of "
                         f"{getattr(state, 'numel', lambda: '?')()} elements")
    data = bytes(state.cpu().tolist())
    seeds = [int.from_bytes(data[i:i + _SEED_BYTES], "little", signed=False) for i in range(0, len(data), _SEED_BYTES)]
    return (seeds[0], seeds[0]) if len(seeds) == 1 else (seeds[0], seeds[1])


class XlaGenerator:
    """torch.Generator-like view of one XLA device's RNG."""

    def __init__(self, device):
        self.device = device
        self._initial_seed = runtime.get_rng_seed(device)
        self._base_at_sync = None  # the base seed to put back at the next sync, if any
        self._armed = False

    def get_state(self):
        """This device's RNG state as torch.cuda.get_rng_state gives it: a uint8 CPU tensor of 16 bytes (seeds_to_state).
        Reading does not move the random stream: later random ops draw as they would have without the read."""
        running = runtime.get_rng_seed(self.device)
        if self._base_at_sync is not None:
            # After a mid-step restore, torch_xla's base is the reset one until the next sync: the
            # base that sync will put back is the step's real one.
            return seeds_to_state(self._base_at_sync, running)
        # Reading the base rewinds torch_xla's running seed to it: carry on from `running`.
        base = runtime.get_rng_base_seed(self.device)
        self._resume(base, running)
        return seeds_to_state(base, running)

    def set_state(self, state):
        """Restore a state from get_state() (16 bytes, or 8 from earlier versions); returns self, as torch.Generator.
        The running seed is set now, the step's base seed at the next sync; ValueError for any other tensor."""
        self._resume(*state_to_seeds(state))
        return self

    def _resume(self, base, running):
        """Random ops continue from `running`; the step's base is `base` at the next sync."""
        runtime.set_rng_seed(running, self.device)
        self._base_at_sync = base if base != running else None
        if self._base_at_sync is not None and not self._armed:
            self._armed = True
            runtime.after_next_sync(self._restore_base)

    def _restore_base(self):
        self._armed = False
        if self._base_at_sync is not None:
            runtime.set_rng_seed(runtime.next_step_seed(self._base_at_sync), self.device)
            self._base_at_sync = None

    def manual_seed(self, seed):
        """Seed the device (running and base seed, torch_xla's set_rng_state) and make `seed` the initial seed; returns self,
        as torch.Generator.manual_seed. A base seed still pending from set_state() is dropped."""
        self._initial_seed = int(seed)
        self._base_at_sync = None
        runtime.set_rng_seed(seed, self.device)
        return self

    def initial_seed(self):
        """The int seed of the last manual_seed(), else the device's seed when this generator was made (torch.Generator's)."""
        return self._initial_seed

    def seed(self):
        """Seed the device with a non-deterministic seed from torch.seed() (which reseeds the host default generator too) and
        return it, as torch.Generator.seed."""
        seed = torch.seed()
        self.manual_seed(seed)
        return seed
