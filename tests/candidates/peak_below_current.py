"""max_memory_allocated() reports less than memory_allocated(): a peak kept for half the memory (say, one of
two pools). Far below, so host-sampled figures that move by a few pages between reads cannot hide it."""

from deepspeed_xla.accelerator import XLA_Accelerator


class PeakBelowCurrent(XLA_Accelerator):

    def max_memory_allocated(self, device_index=None):
        return self.memory_allocated(device_index) // 2
