"""device_count() asks the XLA runtime, which starts it (and on a TPU host takes the chips)."""

import torch_xla.runtime as xr

from deepspeed_xla.accelerator import XLA_Accelerator


class DeviceCountStartsRuntime(XLA_Accelerator):

    def device_count(self):
        return xr.addressable_runtime_device_count()
