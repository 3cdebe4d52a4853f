"""Op builders (DeepSpeedAccelerator op-builder APIs). A DeepSpeed config naming Adam/AdamW
loads FusedAdam through create_op_builder("FusedAdamBuilder"); its kernel must compute the same
update as torch.optim.AdamW on XLA tensors (a host kernel there crashes or silently computes
garbage), and kernels that cannot exist on XLA must say so instead of breaking the import."""

import importlib

import pytest
import torch

from conformance_helpers import host

pytestmark = pytest.mark.area("interface")

LR, BETAS, EPS, WEIGHT_DECAY, STEPS = 1e-2, (0.9, 0.999), 1e-8, 0.01, 3


def _params_and_grads(seed):
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(5, 3, generator=generator), torch.randn(7, generator=generator)]
    grads = [[torch.randn(p.shape, generator=generator) for p in params] for _ in range(STEPS)]
    return params, grads


def _reference_adamw(params, grads):
    """torch.optim.AdamW on the host: the update the kernel must reproduce."""
    params = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        optimizer.step()
    return [p.detach() for p in params]


def _max_errors(result, reference):
    abs_err = max((r - e).abs().max().item() for r, e in zip(result, reference))
    rel_err = max(((r - e).abs() / e.abs().clamp_min(1e-6)).max().item() for r, e in zip(result, reference))
    return abs_err, rel_err


def test_op_builder_dir(accel):
    name = accel.op_builder_dir()
    assert isinstance(name, str) and name, f"op_builder_dir() returned {name!r}"
    try:
        importlib.import_module(name)
    except ImportError:
        importlib.import_module(f"deepspeed.ops.{name}")  # DeepSpeed's own accelerators name their subpackage


def test_get_op_builder(accel):
    builder_class = accel.get_op_builder("FusedAdamBuilder")
    assert isinstance(builder_class, type), f"get_op_builder('FusedAdamBuilder') returned {builder_class!r}"
    builder = builder_class()
    assert builder.is_compatible() is True, "FusedAdamBuilder is not compatible; Adam configs could not run"
    # A CUDA-only kernel: absent (None) or a builder that reports itself incompatible.
    cuda_only = accel.get_op_builder("InferenceBuilder")
    if cuda_only is not None:
        assert cuda_only().is_compatible() is False, "InferenceBuilder (CUDA kernels) claims to be compatible on XLA"


def test_create_op_builder(accel, xla_device, evidence):
    from deepspeed.ops.adam.multi_tensor_apply import MultiTensorApply

    builder = accel.create_op_builder("FusedAdamBuilder")
    assert builder is not None, "create_op_builder('FusedAdamBuilder') returned None"
    kernel = builder.load().multi_tensor_adam
    params, grads = _params_and_grads(0)
    on_device = [p.clone().to(xla_device) for p in params]
    exp_avg = [torch.zeros_like(p) for p in on_device]
    exp_avg_sq = [torch.zeros_like(p) for p in on_device]
    noop = torch.zeros(1, dtype=torch.int, device=xla_device)
    applier = MultiTensorApply(2048 * 32)
    for step, step_grads in enumerate(grads, 1):
        device_grads = [g.to(xla_device) for g in step_grads]
        applier(kernel, noop, [device_grads, on_device, exp_avg, exp_avg_sq], LR, BETAS[0], BETAS[1], EPS, step,
                1, 1, WEIGHT_DECAY)  # adam_w_mode=1, bias_correction=1, as FusedAdam(adam_w_mode=True) calls it
    result = [host(p) for p in on_device]
    abs_err, rel_err = _max_errors(result, _reference_adamw(params, grads))
    evidence.update(max_abs_error=abs_err, max_rel_error=rel_err, tolerance=1e-5, steps=STEPS)
    assert abs_err <= 1e-5, (f"FusedAdam's multi_tensor_adam on XLA tensors diverges from torch.optim.AdamW by "
                             f"{abs_err:.3g} (max abs) after {STEPS} steps; tolerance 1e-5")


def test_create_op_builder__fused_adam_optimizer(accel, xla_device, evidence):
    """DeepSpeed's FusedAdam optimizer class (what "type": "AdamW" resolves to) on XLA parameters."""
    from deepspeed.ops.adam import FusedAdam

    params, grads = _params_and_grads(1)
    device_params = [torch.nn.Parameter(p.clone().to(xla_device)) for p in params]
    optimizer = FusedAdam(device_params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, adam_w_mode=True)
    for step_grads in grads:
        for p, g in zip(device_params, step_grads):
            p.grad = g.to(xla_device)
        optimizer.step()
    abs_err, rel_err = _max_errors([host(p) for p in device_params], _reference_adamw(params, grads))
    evidence.update(max_abs_error=abs_err, max_rel_error=rel_err, tolerance=1e-5, steps=STEPS)
    assert abs_err <= 1e-5, f"FusedAdam on XLA parameters diverges from torch.optim.AdamW by {abs_err:.3g} (max abs)"


def test_build_extension(accel):
    extension = accel.build_extension()
    from setuptools.command.build_ext import build_ext
    assert isinstance(extension, type) and issubclass(extension, build_ext), (
        f"build_extension() returned {extension!r}, expected a setuptools build_ext command class")
