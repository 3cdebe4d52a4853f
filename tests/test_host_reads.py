"""DeepSpeed's overflow, inf/NaN and gradient-norm checks on XLA (deepspeed_xla/patches/host_reads.py): the
same answers as on the host, with the device read once."""

import textwrap

from helpers import last_json, run_python

from harness.launching import single_rank_env


def test_overflow_check_reads_the_device_once_and_answers_as_on_the_host():
    """DeepSpeed's CheckOverflow (FP16_Optimizer's, used by bf16 without ZeRO) asks gradient by
    gradient; on XLA the answers are combined on the device and read once, with the same result."""
    code = textwrap.dedent("""
        import json, torch, deepspeed, torch_xla
        import torch_xla.debug.metrics as metrics
        from deepspeed.runtime.utils import CheckOverflow

        def params(device, bad):
            out = []
            for i in range(8):
                p = torch.nn.Parameter(torch.ones(4, device=device))
                p.grad = torch.ones(4, device=device)
                if i == bad:
                    p.grad[1] = float("inf") if i % 2 else float("nan")
                out.append(p)
            return out

        def transfers():
            return (metrics.metric_data("TransferFromDeviceTime") or [0])[0]

        seen = {}
        for bad in (None, 0, 5, 7):
            xla_params = params(torch_xla.device(), bad)
            torch_xla.sync()
            before = transfers()
            answer = CheckOverflow().has_overflow_serial(xla_params)
            seen[str(bad)] = [answer, CheckOverflow().has_overflow_serial(params("cpu", bad)), transfers() - before]
        print(json.dumps(seen))
    """)
    result = last_json(run_python(code, "xla"))
    assert result == {"None": [False, False, 1], "0": [True, True, 1], "5": [True, True, 1], "7": [True, True, 1]}, result


def test_gradient_inf_nan_test_is_one_reduction_with_deepspeeds_answers():
    """Every overflow check asks DeepSpeed's `has_inf_or_nan` about each gradient: an `amax` and an
    `amin`, two reductions that XLA CPU lowers as windowed reductions (a 2-rank bf16 ZeRO-1 step spent
    16 ms per step on them). On XLA the test is whether every element is finite, one reduction, and
    answers as DeepSpeed's does on the CPU for every kind of value."""
    code = textwrap.dedent("""
        import json, re, torch, deepspeed, torch_xla
        from deepspeed.runtime.zero import stage_1_and_2

        answers = {}
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for bad in (None, "inf", "-inf", "nan"):
                if bad and dtype == torch.int32:
                    continue
                x = torch.arange(512).reshape(8, 64).to(dtype)
                if bad:
                    x[5, 7] = float(bad)
                answers[f"{dtype} {bad}"] = [stage_1_and_2.has_inf_or_nan(x.to(torch_xla.device())).item(),
                                             stage_1_and_2.has_inf_or_nan(x).item()]
        empty = torch.zeros(0)
        answers["empty"] = [stage_1_and_2.has_inf_or_nan(empty.to(torch_xla.device())).item(),
                            stage_1_and_2.has_inf_or_nan(empty).item()]
        flag = stage_1_and_2.has_inf_or_nan(torch.ones(8, 64, dtype=torch.bfloat16).to(torch_xla.device()))
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([flag])
        print(json.dumps({"answers": answers, "reductions": len(re.findall(r" reduce\\(", hlo))}))
    """)
    result = last_json(run_python(code, "xla"))
    differing = {case: pair for case, pair in result["answers"].items() if pair[0] != pair[1]}
    assert not differing and len(result["answers"]) == 10, (
        f"has_inf_or_nan on XLA answers [xla, cpu] differently for {differing} (all: {result['answers']})")
    assert result["reductions"] == 1, (
        f"testing one gradient for inf/NaN on XLA takes {result['reductions']} reductions; one is enough")


def test_host_values_no_group_needs_stay_on_the_host():
    """DeepSpeed puts the overflow flag and the flattened gradient norm into a device tensor to
    all-reduce them over a group and reads them back. With no group taking part, on XLA they stay on
    the host: the same answers (the norm rounded to fp32 as before) and no transfer of their own; with a
    model-parallel group the collective still gets a device tensor, read back once."""
    code = textwrap.dedent("""
        import json, torch, deepspeed, torch_xla
        import torch_xla.debug.metrics as metrics
        from deepspeed.runtime import utils
        from deepspeed.runtime.fp16 import fused_optimizer

        class ModelParallel:  # an mpu whose model-parallel group is the (one-rank) world
            def get_model_parallel_group(self):
                return None

        def params(device, bad=None):
            out = []
            for i in range(4):
                p = torch.nn.Parameter(torch.ones(5, device=device))
                p.grad = torch.arange(5, dtype=torch.float32, device=device) / (i + 3)
                if i == bad:
                    p.grad[2] = float("inf")
                out.append(p)
            return out

        def measured(call):
            torch_xla.sync()
            before = (metrics.metric_data("TransferFromDeviceTime") or [0])[0]
            answer = call()
            return [answer, (metrics.metric_data("TransferFromDeviceTime") or [0])[0] - before]

        deepspeed.init_distributed()
        xla = torch_xla.device()
        print(json.dumps({
            "overflow": [measured(lambda: utils.CheckOverflow().has_overflow(params(xla, bad))) for bad in (None, 1)],
            "overflow_cpu": [utils.CheckOverflow().has_overflow(params("cpu", bad)) for bad in (None, 1)],
            "norm": measured(lambda: utils.get_flattened_grad_norm(params(xla))),
            "norm_model_parallel": measured(lambda: utils.get_flattened_grad_norm(params(xla), mpu=ModelParallel())),
            "norm_cpu": utils.get_flattened_grad_norm(params("cpu")),
            "optimizer_uses_it": fused_optimizer.get_flattened_grad_norm is utils.get_flattened_grad_norm,
        }))
    """)
    result = last_json(run_python(code, "xla", single_rank_env()))
    assert result["overflow"] == [[False, 1], [True, 1]] and result["overflow_cpu"] == [False, True], result
    # get_flattened_grad_norm reads each of the 4 gradients' norms itself; the model-parallel one reads its sum back too
    assert result["norm"] == [result["norm_cpu"], 4] and result["norm_model_parallel"] == [result["norm_cpu"], 5], result
    assert result["optimizer_uses_it"], "FP16_Optimizer calls DeepSpeed's own get_flattened_grad_norm, not the wrapped one"


def test_zero_norm_validity_is_read_once_per_norm_and_again_after_it_changes():
    """ZeRO-1/2's step asks `is_invalid_grad_norm` twice about the same norm tensor; on XLA the second
    answer comes without a second transfer, and a norm changed in place is asked again."""
    code = textwrap.dedent("""
        import json, torch, deepspeed, torch_xla
        import torch_xla.debug.metrics as metrics
        from deepspeed.runtime.zero import stage_1_and_2

        def transfers():
            return (metrics.metric_data("TransferFromDeviceTime") or [0])[0]

        seen = []
        for value in (2.0, float("inf"), -1.0):
            norm = torch.tensor(value, device=torch_xla.device())
            torch_xla.sync()
            before = transfers()
            answers = [stage_1_and_2.is_invalid_grad_norm(norm) for _ in range(2)]
            norm.fill_(float("nan") if value == 2.0 else 3.0)
            answers.append(stage_1_and_2.is_invalid_grad_norm(norm))
            expected = [stage_1_and_2.is_invalid_grad_norm(torch.tensor(v)) for v in (value, value)]
            seen.append([answers, expected, transfers() - before])
        print(json.dumps(seen))
    """)
    result = last_json(run_python(code, "xla"))
    assert result == [[[False, False, True], [False, False], 2], [[True, True, False], [True, True], 2],
                      [[True, True, False], [True, True], 2]], result
