"""RNG state taken from (and restored into) the host's CPU generator instead of the XLA device's."""

import torch

from deepspeed_xla.accelerator import XLA_Accelerator


class CpuRngState(XLA_Accelerator):

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        torch.set_rng_state(new_state)
