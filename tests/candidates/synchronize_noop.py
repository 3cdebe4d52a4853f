"""synchronize() does nothing: on a lazy device the queued graph never runs."""

from deepspeed_xla.accelerator import XLA_Accelerator


class SynchronizeNoop(XLA_Accelerator):

    def synchronize(self, device_index=None):
        return None
