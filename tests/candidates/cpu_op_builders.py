"""The naive XLA accelerator: DeepSpeed's CPU op builders behind FusedAdam.

DeepSpeed's AdamW resolves to FusedAdam through the accelerator's op builder; the CPU
builder's host kernels segfault or silently compute wrong updates on XLA tensors.
"""

from deepspeed_xla.accelerator import XLA_Accelerator


class CpuOpBuilders(XLA_Accelerator):

    def op_builder_dir(self):
        return "deepspeed.ops.op_builder.cpu"

    def get_op_builder(self, class_name):
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
        return CPU_Accelerator().get_op_builder(class_name)
