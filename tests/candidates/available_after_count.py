"""is_available() asks the XLA runtime, which starts it, unless device_count() already ran in the process and
left its count behind: probed only after device_count(), in the same process, it would look harmless."""

import torch_xla.runtime as xr

from deepspeed_xla.accelerator import XLA_Accelerator


class AvailableAfterCount(XLA_Accelerator):
    counted = None

    def device_count(self):
        self.counted = super().device_count()
        return self.counted

    def is_available(self):
        if self.counted is None:
            return xr.addressable_runtime_device_count() > 0
        return self.counted > 0
