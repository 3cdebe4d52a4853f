"""The shape of DeepSpeed's tests/unit/util.py bf16 helper: True only for the accelerators it names."""

from deepspeed.accelerator import get_accelerator


def bf16_required_version_check(accelerator_check=True):
    named = get_accelerator().device_name() in ("cuda", "npu", "hpu", "xpu")
    return named and (not accelerator_check or get_accelerator().is_bf16_supported())
