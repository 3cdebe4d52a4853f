"""deepspeed_xla's accelerator without its parameter-identity handling: when DeepSpeed moves
the model to XLA, PyTorch gives every parameter a new object, as a port that only
implements the accelerator interface leaves it. Scripts that hand DeepSpeed a parameter
list, param groups or an optimizer built before `deepspeed.initialize` then train stale CPU
copies (ZeRO-0: silently wrong losses) or crash (ZeRO-1/2: `KeyError: Parameter`, ZeRO-3: no
`partition_numel`), and tied weights come apart. Scripts that let DeepSpeed collect the
parameters after the move still train.
"""

from deepspeed_xla.accelerator import XLA_Accelerator
from deepspeed_xla.patches import param_identity


class LosesParameterIdentity(XLA_Accelerator):

    def __init__(self):
        super().__init__()
        param_identity.uninstall()
