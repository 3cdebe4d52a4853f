"""deepspeed_xla's accelerator class alone, without the package's checkpoint handling: DeepSpeed's
`torch.save` then pickles XLA tensors into the checkpoint, as a port that carries over only the
accelerator would. Such a checkpoint loads only where torch_xla is (not on CPU, not in
zero_to_fp32.py), and not even there through the callable `map_location` DeepSpeed's loaders pass.

(A candidate other than deepspeed_xla runs without deepspeed_xla's start-up hooks, where the
checkpoint handling lives; the class below changes nothing else.)
"""

from deepspeed_xla.accelerator import XLA_Accelerator


class DeviceTensorCheckpoints(XLA_Accelerator):
    pass
