"""on_accelerator() treats every non-CPU tensor as on the accelerator (meta tensors included)."""

from deepspeed_xla.accelerator import XLA_Accelerator


class WrongOnAccelerator(XLA_Accelerator):

    def on_accelerator(self, tensor):
        return tensor.device.type != "cpu"
