"""The accelerator without the HuggingFace integration (deepspeed_xla/huggingface.py): as an upstream port that
stops at DeepSpeed's interface. Installed by class, it arms none of deepspeed_xla's transformers/Accelerate hooks,
so Trainer and Accelerate take torch_xla's own mode (a world of 1 per process on PJRT CPU) and a 2-rank run stops
at DeepSpeed's batch-size assertion. deepspeed.initialize on Transformers models still trains."""

from deepspeed_xla.accelerator import XLA_Accelerator


class WithoutHuggingFace(XLA_Accelerator):
    pass
