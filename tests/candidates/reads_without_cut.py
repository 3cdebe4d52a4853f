"""DeepSpeed's host reads inside its step (the gradient norm, the overflow check) compute only the
value they read, as `tensor.item()` does in PyTorch/XLA: the rest of the step stays pending, and the
next read, or the sync at the step's end, runs the forward and backward passes again. Every count
of graphs and transfers stays the same; only what the graphs compute grows."""

from deepspeed_xla.accelerator import XLA_Accelerator
from deepspeed_xla.patches import step_graphs


class ReadsWithoutCut(XLA_Accelerator):

    def __init__(self):
        super().__init__()
        # A port without deepspeed_xla's cut before the engine's reads (step_graphs.py).
        step_graphs._engine_reads_now = lambda: False
