"""device_name(i) is `xla:i` for every index, as if each process saw every chip of its host: in a
rank that DeepSpeed's launcher started with LOCAL_RANK=1, device_name(local_rank) then names a
device the process does not own (a TPU worker sees one chip, as xla:0)."""

import torch

from deepspeed_xla.accelerator import XLA_Accelerator


class DeviceNameIgnoresLocalRank(XLA_Accelerator):

    def device_name(self, device_index=None):
        if device_index is None:
            return "xla"
        if isinstance(device_index, torch.device):
            device_index = device_index.index
        return f"xla:{int(str(device_index).removeprefix('xla:'))}"
