"""device_name(index) names the current device whatever index it is given."""

from deepspeed_xla.accelerator import XLA_Accelerator


class DeviceNameIgnoresIndex(XLA_Accelerator):

    def device_name(self, device_index=None):
        return "xla" if device_index is None else self.current_device_name()
