"""range_pop() cuts the graph, so that a profile shows each range's device time: every range
DeepSpeed closes in a step (its engine and ZeRO methods are instrumented) adds a graph execution."""

from deepspeed_xla.accelerator import XLA_Accelerator
from deepspeed_xla.backend import runtime


class RangePopSyncs(XLA_Accelerator):

    def range_pop(self):
        runtime.sync()
        return super().range_pop()
