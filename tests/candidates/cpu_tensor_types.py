"""FloatTensor is torch's CPU FloatTensor: DeepSpeed's norms and overflow flags land on the host."""

import torch

from deepspeed_xla.accelerator import XLA_Accelerator


class CpuFloatTensor(XLA_Accelerator):

    @property
    def FloatTensor(self):
        return torch.FloatTensor
