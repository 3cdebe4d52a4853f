"""Torch-native versions of the optimizer kernels DeepSpeed loads through op builders.

Each function has the signature of the CUDA kernel it replaces (called through
DeepSpeed's `multi_tensor_applier`) and the same arithmetic: the update is computed in
fp32 whatever the storage dtype, then written back in place into params and states.

An fp32 parameter is updated with in-place arithmetic (`sub_`, `mul_`), not by `copy_` of
the new value: with `copy_`, torch_xla 2.9 donates the parameter's buffer to another of
the step's outputs (an optimizer moment of the same shape), and XLA then copies both
buffers in every step's graph. The arithmetic is the same either way.
"""

import math
import types

import torch


def _subtract(param, p, decrement):
    # param = p - decrement, where p is param computed in fp32: in place when that is param itself.
    if p is param:
        param.sub_(decrement)
    else:
        param.copy_(p - decrement)


@torch.no_grad()
def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, adam_w_mode,
                      bias_correction, weight_decay):
    """Adam (adam_w_mode=0: L2 added to the gradient) or AdamW (1: decoupled decay)."""
    bias_correction1 = 1 - beta1**step if bias_correction else 1.0
    bias_correction2 = 1 - beta2**step if bias_correction else 1.0
    for grad, param, exp_avg, exp_avg_sq in zip(*tensor_lists):
        g, p = grad.float(), param.float()
        if not adam_w_mode and weight_decay != 0:
            g = g + weight_decay * p
        m = beta1 * exp_avg.float() + (1 - beta1) * g
        v = beta2 * exp_avg_sq.float() + (1 - beta2) * g * g
        update = (m / bias_correction1) / ((v / bias_correction2).sqrt() + eps)
        if adam_w_mode and weight_decay != 0:
            update = update + weight_decay * p
        _subtract(param, p, lr * update)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)


@torch.no_grad()
def multi_tensor_lion(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, step, weight_decay):
    """Lion: step by -lr*sign of the interpolated momentum (+lr where it is not positive,
    as the CUDA kernel does), with decoupled weight decay."""
    for grad, param, exp_avg in zip(*tensor_lists):
        g, p, m = grad.float(), param.float(), exp_avg.float()
        c = beta1 * m + (1 - beta1) * g
        update = torch.where(c > 0, -lr, lr)
        if p is param:
            param.mul_(1 - lr * weight_decay).add_(update)
        else:
            param.copy_(p * (1 - lr * weight_decay) + update)
        exp_avg.copy_(beta2 * m + (1 - beta2) * g)


@torch.no_grad()
def lamb(param, param_copy, exp_avg, exp_avg_sq, grad, lr, beta1, beta2, max_coeff, min_coeff, eps, grad_scale, step,
         eps_mode, bias_correction, weight_decay):
    """LAMB for one tensor: an Adam direction (eps under the square root when
    eps_mode=0, outside when 1) plus decay, scaled by the trust ratio ||p|| / ||update||
    clamped to [min_coeff, max_coeff] (1 when either norm is zero). Returns the ratio."""
    if bias_correction:
        step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    else:
        step_size = lr
    g, p = grad.float() / grad_scale, param.float()
    m = beta1 * exp_avg.float() + (1 - beta1) * g
    v = beta2 * exp_avg_sq.float() + (1 - beta2) * g * g
    denom = (v + eps).sqrt() if eps_mode == 0 else v.sqrt() + eps
    update = m / denom + weight_decay * p
    weight_norm, update_norm = p.norm(), update.norm()
    trust = torch.where((weight_norm != 0) & (update_norm != 0),
                        (weight_norm / update_norm).clamp(min_coeff, max_coeff), torch.ones_like(weight_norm))
    _subtract(param, p, step_size * trust * update)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    if param_copy.numel() > 0:
        param_copy.copy_(param)
    return trust.reshape(1)


fused_adam = types.SimpleNamespace(multi_tensor_adam=multi_tensor_adam)
fused_lion = types.SimpleNamespace(multi_tensor_lion=multi_tensor_lion)
fused_lamb = types.SimpleNamespace(lamb=lamb)
