"""FusedAdam's kernel lets the step count into the graph's structure (here a shape): the
numbers are right, but every step traces a new graph and XLA recompiles it.

(DeepSpeed's op builders are imported lazily: candidate modules load while DeepSpeed itself is
still being imported.)
"""

import types

import torch

from deepspeed_xla.accelerator import XLA_Accelerator


@torch.no_grad()
def _adam_with_step_shape(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, adam_w_mode,
                             bias_correction, weight_decay):
    from deepspeed_xla.op_builder.torch_native import multi_tensor_adam
    multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, adam_w_mode,
                      bias_correction, weight_decay)
    for param in tensor_lists[1]:
        # Adds exactly zero, through a tensor whose shape depends on the step.
        param.add_(torch.zeros(step, dtype=param.dtype, device=param.device).sum())


class StepShapedAdam(XLA_Accelerator):

    def get_op_builder(self, class_name):
        builder = super().get_op_builder(class_name)
        if class_name != "FusedAdamBuilder":
            return builder
        return type("StepShapedAdamBuilder", (builder, ),
                    {"MODULE": types.SimpleNamespace(multi_tensor_adam=_adam_with_step_shape)})
