"""FusedAdam's kernel ignores adam_w_mode: AdamW configs silently get Adam with L2 decay.

(DeepSpeed's op builders are imported lazily: candidate modules load while DeepSpeed itself is
still being imported.)
"""

import types

from deepspeed_xla.accelerator import XLA_Accelerator


def _l2_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, adam_w_mode, bias_correction,
             weight_decay):
    from deepspeed_xla.op_builder.torch_native import multi_tensor_adam
    multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, 0, bias_correction,
                      weight_decay)


class L2Adam(XLA_Accelerator):

    def get_op_builder(self, class_name):
        builder = super().get_op_builder(class_name)
        if class_name != "FusedAdamBuilder":
            return builder
        return type("L2AdamBuilder", (builder, ), {"MODULE": types.SimpleNamespace(multi_tensor_adam=_l2_adam)})
