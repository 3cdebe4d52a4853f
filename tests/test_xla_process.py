"""What a DS_ACCELERATOR=xla process gets beyond the accelerator's methods, each in a fresh
interpreter as a user script would start: DeepSpeed's op registry lists every op, a CPU
backward pass before training does not break XLA's autograd, ZeRO's bucket sizes stay
within the model, the overflow check reads the device once and tests each gradient in one
reduction, PJRT CPU's freed buffers stay with the process, each local rank of PJRT CPU runs on
its own cores, a pipeline step compiles nothing after warm-up, a two-rank ZeRO-2 step runs its
forward and backward passes once, a ZeRO step writes its parameters out only as their flat
buffer, a ZeRO-2 step reads its gradient partition in parameter order, the optimizer kernels
update their buffers in place, and a process exits while steps that release adopted host buffers are still
running."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from deepspeed_xla.backend import core_binding, host_memory
from deepspeed_xla.patches.zero_buffers import bounded
from harness.candidate.candidates import parse_spec
from harness.launching import launch, single_rank_env
from test_activation import last_json, run_python


def test_op_registry_lists_every_deepspeed_op_with_its_compatibility():
    code = textwrap.dedent("""
        import json
        import deepspeed.ops
        from deepspeed_xla.op_builder import deepspeed_builder_classes
        names = sorted({cls.NAME for cls in deepspeed_builder_classes().values()})
        print(json.dumps({"ops": deepspeed.ops.__compatible_ops__, "deepspeed_names": names}))
    """)
    result = last_json(run_python(code, "xla"))
    ops = result["ops"]
    missing = [name for name in result["deepspeed_names"] if name not in ops]
    assert not missing, f"__compatible_ops__ lacks DeepSpeed ops {missing}"
    wrong = {name: ops.get(name) for name, want in {
        "fused_adam": True, "fused_lamb": True, "fused_lion": True, "cpu_adam": True, "cpu_adagrad": True,
        "cpu_lion": True, "transformer": False, "transformer_inference": False, "quantizer": False}.items()
        if ops.get(name) is not want}
    assert not wrong, f"__compatible_ops__ under XLA has the wrong compatibility for {wrong}"


def test_ds_report_lists_the_ops():
    proc = run_python("from deepspeed.env_report import main; main()", "xla")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("fused_adam", "cpu_adam", "transformer_inference"):
        assert any(line.startswith(f"{name} .") for line in proc.stdout.splitlines()), f"ds_report does not list {name}"


@pytest.mark.parametrize("when", ["before-deepspeed-import", "after-deepspeed-import"])
def test_a_cpu_backward_first_leaves_xla_backward_working(when):
    cpu_backward = "probe = torch.nn.Linear(2, 1); probe(torch.ones(1, 2)).sum().backward()\n"
    code = ("import json, torch\n" + (cpu_backward if when == "before-deepspeed-import" else "") +
            "import deepspeed, torch_xla\n"
            "started = torch_xla._XLAC._xla_runtime_is_initialized()\n" +
            (cpu_backward if when == "after-deepspeed-import" else "") +
            "w = torch.ones(3, device=torch_xla.device(), requires_grad=True)\n"
            "(w * 2).sum().backward()\n"
            "print(json.dumps({'grad': w.grad.cpu().tolist(), 'started_by_import': started}))\n")
    result = last_json(run_python(code, "xla"))
    assert result["grad"] == [2.0, 2.0, 2.0]
    if when == "after-deepspeed-import":
        assert not result["started_by_import"], "importing DeepSpeed started the XLA runtime (the launcher parent does)"


def test_zero_bucket_sizes_are_bounded_by_the_model():
    code = textwrap.dedent("""
        import json, torch, deepspeed
        model = torch.nn.Linear(10, 5)  # 55 parameters
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
            "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 2}})
        print(json.dumps({"reduce": engine.zero_reduce_bucket_size(), "allgather": engine.zero_allgather_bucket_size(),
                          "reduce_kept": engine.optimizer.reduce_bucket_size}))
    """)
    result = last_json(run_python(code, "xla", single_rank_env()))
    assert result == {"reduce": 56, "allgather": 56, "reduce_kept": 56}, result


def test_freed_device_buffers_stay_with_the_process_on_pjrt_cpu():
    # Each step's graph output is a new 48 MB PJRT CPU buffer (above glibc's largest mmap threshold,
    # 32 MiB). With glibc's own settings ("system") freeing it unmaps it: the resident size drops by
    # 48 MB, which shows the measurement sees the buffer; kept ("keep"), it stays at its peak. Resident
    # size rather than page faults: a loaded or NUMA-balancing host adds minor faults to kept pages too.
    code = textwrap.dedent("""
        import gc, json, os, torch, deepspeed, torch_xla
        def resident_mb():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        x = torch.ones(12 * 2**20, device=torch_xla.device())
        drops = []
        for _ in range(6):
            y = x * 2
            torch_xla.sync()
            torch_xla._XLAC._xla_wait_device_ops([])
            peak = resident_mb()
            del y
            gc.collect()
            torch_xla._XLAC._xla_wait_device_ops([])
            drops.append(peak - resident_mb())
        print(json.dumps({"drops_mb": drops}))
    """)
    drops = {setting: last_json(run_python(code, "xla", {"DS_XLA_CPU_MALLOC": setting, "PJRT_DEVICE": "CPU"}))
             ["drops_mb"] for setting in ("keep", "system")}
    assert min(drops["system"]) >= 40, f"{drops}: with glibc's settings freeing a 48 MB buffer did not shrink the process"
    assert max(drops["keep"]) <= 4, (
        f"resident size drops (MB) per freed 48 MB buffer {drops}: with DS_XLA_CPU_MALLOC=keep freed device memory "
        "still went back to the kernel")


@pytest.mark.parametrize("environ", [{"PJRT_DEVICE": "TPU"}, {}, {"PJRT_DEVICE": "CPU", "DS_XLA_CPU_MALLOC": "system"},
                                     {"PJRT_DEVICE": "TPU", "DS_XLA_CPU_MALLOC": ""}],
                         ids=["tpu", "unset", "system", "tpu-empty-setting"])
def test_glibc_is_left_alone_off_pjrt_cpu_or_when_asked(environ):
    # A TPU's device memory is its runtime's; this process's glibc settings must not change.
    assert host_memory.keep_freed_memory(environ) is False


def test_a_bad_cpu_malloc_setting_is_refused_in_one_line():
    proc = run_python("import deepspeed", "xla", {"DS_XLA_CPU_MALLOC": "tcmalloc", "PJRT_DEVICE": "CPU"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "DS_XLA_CPU_MALLOC='tcmalloc'" in proc.stderr, proc.stderr[-2000:]


CORES_REPORT = textwrap.dedent("""
    import json, multiprocessing, os, sys, threading
    if len(sys.argv) > 1:  # narrowed before the accelerator loads, as numactl or taskset would start the worker
        os.sched_setaffinity(0, {int(sys.argv[1])})
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    get_accelerator()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
    thread.start()
    thread.join()
    if __name__ == "__main__":
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            child = pool.apply(sorted, (os.sched_getaffinity(0),))
        import torch
        print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "thread": seen[0], "child": child,
                          "bound": os.environ.get("DS_XLA_CORES_BOUND"), "torch_threads": torch.get_num_threads()}))
""")


def _cores_of_local_rank(tmp_path, local_rank, local_size, extra_env=None, argv=()):
    script = tmp_path / f"cores_{local_rank}.py"
    script.write_text(CORES_REPORT)
    env = {"PJRT_DEVICE": "CPU", "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_size), **(extra_env or {})}
    environ = {key: value for key, value in os.environ.items() if key not in ("DS_XLA_CORES_BOUND", "OMP_NUM_THREADS")}
    proc = subprocess.run([sys.executable, str(script), *argv], env={**environ, "DS_ACCELERATOR": "xla", **env},
                          capture_output=True, text=True, timeout=300)
    report = last_json(proc)
    assert report["thread"] == report["main"] == report["child"], (
        f"local rank {local_rank}: a later thread or a spawned child runs on other cores than the rank: {report}")
    if report["bound"]:
        assert report["torch_threads"] == len(report["main"]), (
            f"local rank {local_rank}: PyTorch keeps {report['torch_threads']} threads on {report['main']}")
    return set(report["main"]), report["bound"]


def test_each_local_rank_of_pjrt_cpu_runs_on_its_own_cores(tmp_path):
    cores = os.sched_getaffinity(0)
    ranks = [_cores_of_local_rank(tmp_path, rank, 2)[0] for rank in range(2)]
    assert set().union(*ranks) == cores, f"local ranks' cores {ranks} do not cover this host's {sorted(cores)}"
    if len(cores) >= 2:
        assert ranks[0] and ranks[1] and not ranks[0] & ranks[1], (
            f"two local ranks on {len(cores)} cores got {ranks}: each should have a share of its own")


@pytest.mark.parametrize("case", ["setting-none", "one-local-rank", "narrowed-by-launcher"])
def test_cores_are_left_alone_when_the_rank_is_bound_elsewhere_or_alone(case, tmp_path):
    # The binding's own record (DS_XLA_CORES_BOUND) tells a share it left alone from one it bound to the same cores.
    cores = os.sched_getaffinity(0)
    if case == "narrowed-by-launcher":
        last = max(cores)
        assert _cores_of_local_rank(tmp_path, 0, 2, argv=[str(last)]) == ({last}, None)
        return
    extra = {"DS_XLA_BIND_CORES": "none"} if case == "setting-none" else {}
    assert _cores_of_local_rank(tmp_path, 0, 2 if case == "setting-none" else 1, extra) == (cores, None)


@pytest.mark.parametrize("local_rank,local_size,cores,expected", [
    (0, 2, [0, 1], [0]), (1, 2, [0, 1], [1]), (1, 2, [4, 5, 6, 7], [6, 7]), (2, 3, range(8), [5, 6, 7]),
    (0, 4, [0, 1], [0]), (1, 4, [0, 1], [0]), (3, 4, [0, 1], [1]), (0, 1, [3, 1], [1, 3])])
def test_core_share_of_a_local_rank(local_rank, local_size, cores, expected):
    assert core_binding.share(local_rank, local_size, cores) == expected


@pytest.mark.parametrize("device,local_rank", [("TPU", "0"), ("CPU", "-1"), ("CPU", "4")],
                         ids=["tpu", "not-launched", "rank-past-its-size"])
def test_cores_are_left_alone_off_pjrt_cpu_or_outside_the_local_ranks(device, local_rank):
    environ = {"PJRT_DEVICE": device, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": "4"}
    assert core_binding.bind_local_rank(environ) is None and core_binding.BOUND not in environ


@pytest.mark.parametrize("name", ["LOCAL_RANK", "LOCAL_WORLD_SIZE"])
def test_a_local_rank_that_is_not_a_number_is_refused_in_one_line(name):
    env = {"PJRT_DEVICE": "CPU", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", name: "two"}
    proc = run_python("import deepspeed", "xla", env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{name}='two' is not an integer" in proc.stderr, proc.stderr[-2000:]


def test_a_child_of_a_bound_rank_keeps_the_rank_s_cores():
    # On a bigger host a child re-splitting its rank's share would run on a part of it (on 2 cores the share of a share
    # is the same core, so the spawned child in test_each_local_rank_of_pjrt_cpu_runs_on_its_own_cores cannot tell).
    code = textwrap.dedent("""
        import json, os
        from deepspeed_xla.backend import core_binding
        environ = {"PJRT_DEVICE": "CPU", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", core_binding.BOUND: "1/2"}
        print(json.dumps({"bound": core_binding.bind_local_rank(environ), "cores": sorted(os.sched_getaffinity(0))}))
    """)
    report = last_json(run_python(code, None))
    assert report == {"bound": None, "cores": sorted(os.sched_getaffinity(0))}, report


def test_a_bad_bind_cores_setting_is_refused_in_one_line():
    proc = run_python("import deepspeed", "xla", {"DS_XLA_BIND_CORES": "numa", "PJRT_DEVICE": "CPU"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "DS_XLA_BIND_CORES='numa'" in proc.stderr, proc.stderr[-2000:]


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


def test_pipeline_steps_compile_nothing_after_warm_up():
    """PipelineEngine.train_batch takes its optimizer step without engine.step(); an fp32 step without
    ZeRO reads nothing on the host, so unless the step ends in a sync each update stays pending and
    the next step's graph holds all of them: one more compilation every step, each step slower."""
    code = textwrap.dedent("""
        import json, torch, deepspeed
        import torch_xla.debug.metrics as metrics
        from deepspeed.pipe import PipelineModule
        deepspeed.init_distributed()
        torch.manual_seed(0)
        model = PipelineModule(layers=[torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)], num_stages=1,
                               loss_fn=torch.nn.MSELoss())
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "steps_per_print": 1000})
        g = torch.Generator().manual_seed(1)
        def batches():
            while True:
                yield torch.randn(4, 8, generator=g).to(engine.device), torch.randn(4, 4, generator=g).to(engine.device)
        data, compilations = batches(), []
        for _ in range(6):
            engine.train_batch(data_iter=data).item()
            compilations.append((metrics.metric_data("CompileTime") or [0])[0])
        print(json.dumps(compilations))
    """)
    compilations = last_json(run_python(code, "xla", single_rank_env()))
    # the first two steps compile (optimizer state made, then the steady step); none after
    assert compilations[2:] == [compilations[2]] * 4, f"compilations after each pipeline step: {compilations}"


def test_profiler_ranges_name_the_ops_inside_them_without_looking_for_jax_each_time():
    """range_push/range_pop scope the ops traced between them (HLO metadata, what XLA profiles show);
    DeepSpeed's ZeRO-3 opens about a hundred ranges per step, so entering one must not search sys.path
    for JAX (torch_xla's own Trace does, about 1 ms each time)."""
    code = textwrap.dedent("""
        import json, re, sys, torch, torch_xla, deepspeed
        from deepspeed.accelerator import get_accelerator

        class CountJaxLookups:
            lookups = 0
            def find_spec(self, name, path=None, target=None):
                CountJaxLookups.lookups += name == "jax"
                return None

        sys.meta_path.insert(0, CountJaxLookups())
        accel = get_accelerator()
        x = torch.ones(2, device=torch_xla.device())
        for _ in range(100):
            accel.range_push("warm")
            accel.range_pop()
        accel.range_push("outer")
        accel.range_push("inner")
        y = x * 3
        accel.range_pop()
        accel.range_pop()
        z = y.exp()
        names = re.findall(r'op_name="([^"]*)"', torch_xla._XLAC._get_xla_tensors_hlo([z]))
        print(json.dumps({"mul": sorted({n for n in names if "aten__mul" in n}),
                          "exp": sorted({n for n in names if "aten__exp" in n}), "jax_lookups": CountJaxLookups.lookups}))
    """)
    result = last_json(run_python(code, "xla", {"XLA_HLO_DEBUG": "1"}))
    assert result["mul"] and all(re.match(r"outer[.\d]*/inner[.\d]*/", name) for name in result["mul"]), result
    assert result["exp"] and not any("outer" in name for name in result["exp"]), result
    assert result["jax_lookups"] <= 1, result


@pytest.mark.parametrize("configured, numel, expected", [(500_000_000, 55, 56), (500_000_000, 2_000, 2_000),
                                                        (1_000, 2_000, 1_000), (10, 1, 2),
                                                        (1_001, 55, 1_001)])  # misaligned: DeepSpeed refuses it
def test_bounded(configured, numel, expected):
    assert bounded(configured, numel) == expected


TRAIN_ONE_STEP = textwrap.dedent("""
    import torch, deepspeed
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 3, sparse={sparse})
        def forward(self, tokens):
            return self.embed(tokens).pow(2).mean()
    model = Model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={{
        "train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "AdamW", "params": {{"lr": 0.1}}}}, {extra}}})
    with torch.no_grad():
        engine(torch.tensor([1, 2], device=engine.device))  # inference is fine either way
    loss = engine(torch.tensor([1, 2], device=engine.device))
    engine.backward(loss)
    engine.step()
    print("trained")
""")


@pytest.mark.parametrize("sparse", [True, False])
def test_sparse_embedding_is_refused_in_one_line(sparse):
    proc = run_python(TRAIN_ONE_STEP.format(sparse=sparse, extra=""), "xla", single_rank_env())
    if not sparse:
        assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-2000:]
        return
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert ("UnsupportedOnXla: deepspeed_xla: Embedding(10, 3, sparse=True) cannot train on XLA, which has no sparse "
            "gradients; build it with sparse=False") in proc.stderr, proc.stderr[-2000:]
    assert "SparseXLA" not in proc.stderr, "the error came from inside torch_xla, not from the check"


def test_fp16_config_is_refused_where_the_device_has_no_fp16():
    proc = run_python(TRAIN_ONE_STEP.format(sparse=False, extra='"fp16": {"enabled": True}'), "xla", single_rank_env())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (
        "UnsupportedOnXla: deepspeed_xla: the config enables fp16, which PJRT CPU (which stands in for a TPU) does not "
        'compute (of XLA devices, only GPUs do); train in bf16 instead: "bf16": {"enabled": true} in place of the '
        '"fp16" section') in proc.stderr, proc.stderr[-2000:]
    assert "Type fp16 is not supported" not in proc.stderr, "DeepSpeed's own refusal came first"


def test_other_uncaught_exceptions_keep_their_traceback():
    proc = run_python("import deepspeed\nfrom deepspeed.accelerator import get_accelerator\nget_accelerator()\n"
                      "raise KeyError('not a refusal')", "xla", single_rank_env())
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "KeyError: 'not a refusal'" in proc.stderr, (
        proc.stderr[-2000:])


def test_compile_backends_that_cannot_compile_xla_tensors_are_refused():
    from deepspeed_xla.patches.xla_limits import UnsupportedOnXla, check_compile_backend
    check_compile_backend("openxla")
    with pytest.raises(UnsupportedOnXla, match="backend 'inductor' does not compile XLA tensors; use 'openxla'"):
        check_compile_backend("inductor")


CHECKPOINTED_DROPOUT = textwrap.dedent("""
    import json, torch, deepspeed, torch_xla
    import torch.utils.checkpoint as tuc
    from deepspeed.accelerator import get_accelerator
    device = torch_xla.device()

    def train(mode):
        get_accelerator().manual_seed(123)
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.GELU()).to(device)
        head = torch.nn.Linear(16, 1).to(device)
        optimizer = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
        data = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(4):
            x = torch.randn(4, 8, generator=data).to(device).requires_grad_()
            if mode == "plain":
                hidden = block(x)
            elif mode == "deepspeed":
                hidden = deepspeed.checkpointing.checkpoint(block, x)
            else:
                hidden = tuc.checkpoint(block, x, use_reentrant=mode == "torch-reentrant")
            loss = head(hidden).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            torch_xla.sync()
            losses.append(loss.item())
        return losses

    print(json.dumps({mode: train(mode) for mode in ("plain", "deepspeed", "torch", "torch-reentrant")}))
""")


def test_recomputed_dropout_replays_its_masks_and_keeps_the_random_stream():
    # torch.utils.checkpoint finds the device's RNG through torch.xla (torch_device_module.py); both
    # it and DeepSpeed's checkpointing restore RNG states mid-step, which must not move later steps'
    # random streams (rng.py).
    curves = last_json(run_python(CHECKPOINTED_DROPOUT, "xla"))
    plain = curves.pop("plain")
    differ = {mode: losses for mode, losses in curves.items() if losses != plain}
    assert not differ, f"recomputed dropout trained differently from the plain run {plain}: {differ}"


def test_checkpoint_saved_on_xla_consolidates_with_zero_to_fp32(tmp_path):
    """XLA tensors have no host address (data_ptr() is 0): DeepSpeed recorded every parameter as
    tied to the first, and zero_to_fp32 rebuilt all of them from it. Tied weights stay tied."""
    code = textwrap.dedent(f"""
        import json, torch, deepspeed
        torch.manual_seed(0)
        class Tied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(6, 4)
                self.mix = torch.nn.Linear(4, 4)
                self.head = torch.nn.Linear(4, 6, bias=False)
                self.head.weight = self.embed.weight
            def forward(self, tokens):
                return self.head(self.mix(self.embed(tokens))).float().logsumexp(-1).mean()
        model = Tied()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={{
            "train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "AdamW", "params": {{"lr": 0.1}}}},
            "zero_optimization": {{"stage": 2}}}})
        tokens = torch.tensor([[1, 2], [3, 4]]).to(engine.device)
        for _ in range(2):
            engine.backward(engine(tokens))
            engine.step()
        engine.save_checkpoint({str(tmp_path)!r}, tag="t")
        torch.save({{name: p.detach().cpu() for name, p in engine.module.named_parameters()}}, {str(tmp_path / "trained.pt")!r})
        print(json.dumps({{"saved": True}}))
    """)
    assert last_json(run_python(code, "xla", single_rank_env()))["saved"]
    check = textwrap.dedent(f"""
        import json, torch
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        rebuilt = get_fp32_state_dict_from_zero_checkpoint({str(tmp_path)!r}, tag="t")
        trained = torch.load({str(tmp_path / "trained.pt")!r})
        print(json.dumps({{"names": sorted(rebuilt), "equal": {{n: torch.equal(rebuilt[n], trained[n]) for n in trained}},
                          "tied": rebuilt["head.weight"] is rebuilt["embed.weight"]}}))
    """)
    result = last_json(run_python(check, "cpu"))
    assert result["names"] == ["embed.weight", "head.weight", "mix.bias", "mix.weight"], result
    assert all(result["equal"].values()) and result["tied"], result


# A child script's start: the graphs it executes go to $GRAPHS_OUT.<rank>.hlo*, and executed_hlo(run) is the
# HLO of those `run()` executes. torch_xla reads the setting at its first graph, so this comes before any import.
EXECUTED_HLO = textwrap.dedent("""
    import glob, os
    out = os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".hlo"
    os.environ.update(XLA_SAVE_TENSORS_FILE=out, XLA_SAVE_TENSORS_FMT="hlo")

    def executed_hlo(run):
        dump = glob.glob(out + "*")
        start = os.path.getsize(dump[0]) if dump else 0
        run()
        with open(glob.glob(out + "*")[0]) as f:
            f.seek(start)
            return f.read()
""")

ONE_STEP_MATMULS = EXECUTED_HLO + textwrap.dedent("""
    import json, re, torch, deepspeed, torch_xla

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)])

    def matmuls_of(step):
        return len(re.findall(r" dot\\(", executed_hlo(step)))

    deepspeed.init_distributed()
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
    net = model()
    # Buckets of one layer each: the backward pass reduces three of them, then the step reads the norm.
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 1100}})

    def deepspeed_step():
        loss = engine(x.to(engine.device)).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()

    hand = model().to(engine.device)
    optimizer = torch.optim.AdamW(hand.parameters(), lr=0.01)

    def hand_step():
        loss = hand(x.to(engine.device)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        loss.item()

    for _ in range(2):
        deepspeed_step()
        hand_step()
    with open(os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".json", "w") as f:
        json.dump({"deepspeed": matmuls_of(deepspeed_step), "hand": matmuls_of(hand_step)}, f)
""")


def two_rank_results(tmp_path, source, env=None):
    """Run child script `source` as two ranks under DeepSpeed's launcher on deepspeed_xla, with `env` added to
    the environment; per rank, the JSON it wrote to $GRAPHS_OUT.<rank>.json."""
    script = tmp_path / "child.py"
    script.write_text(source)
    run = launch([script], parse_spec("deepspeed_xla"), tmp_path, num_gpus=2,
                 env={"GRAPHS_OUT": str(tmp_path / "out"), **(env or {})},
                 timeout=300)
    assert run.returncode == 0 and not run.timed_out, run.log[-3000:]
    return [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_a_two_rank_zero2_step_runs_its_forward_and_backward_passes_once(tmp_path):
    """The host bridge reads each gradient bucket's reduction on the host. Reading only the bucket
    left the forward and backward passes pending, and every later read (the next bucket, the norm,
    the loss) ran them again: the step's graphs held the model's matmuls once per read."""
    for rank, counts in enumerate(two_rank_results(tmp_path, ONE_STEP_MATMULS)):
        assert counts["deepspeed"] == counts["hand"], (
            f"rank {rank}: one ZeRO-2 step executed {counts['deepspeed']} matmuls, a hand-written step "
            f"{counts['hand']}: part of the forward and backward passes ran more than once")


# Prelude of a child script: XLA dumps the optimised HLO of every graph it compiles (under $GRAPHS_OUT.<rank>);
# optimized_hlo() returns their texts in the order they were compiled.
OPTIMIZED_HLO = textwrap.dedent("""
    import glob, os
    dump = os.environ["GRAPHS_OUT"] + "." + os.environ.get("RANK", "0")
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=" + dump

    def optimized_hlo():
        return [open(path).read() for path in sorted(glob.glob(dump + "/*after_optimizations.txt"))]
""")

# Optimised HLO of every graph a two-rank run of a three-layer MLP compiles, under the DeepSpeed config entries in
# $DS_CONFIG (JSON): per graph, how many versions of a whole gradient bucket of $BUCKET elements it concatenates
# (distinct lists of pieces: XLA may repeat one concatenation inside each fusion that reads it), and its matmuls.
BUCKET_FILLS = OPTIMIZED_HLO + textwrap.dedent("""
    import json, re, torch, deepspeed

    deepspeed.init_distributed()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)])
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
    config = json.loads(os.environ["DS_CONFIG"])
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, **config})
    dtype = torch.bfloat16 if config.get("bf16", {}).get("enabled") else torch.float32
    for _ in range(4):
        loss = engine(x.to(engine.device, dtype)).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()
    graphs = []
    bucket = re.escape("[" + os.environ["BUCKET"] + "]{0} concatenate(") + r"([^)]*)\\)"
    for text in optimized_hlo():
        versions = {re.sub(r"\\.\\d+", "", pieces) for pieces in re.findall(bucket, text)}
        graphs.append([len(versions), len(re.findall(r" dot\\(", text))])
    with open(dump + ".json", "w") as f:
        json.dump(graphs, f)
""")


def bucket_fills(tmp_path, config, bucket):
    """Per rank, per graph of a two-rank BUCKET_FILLS run: [versions of a whole `bucket` concatenated, matmuls]."""
    return two_rank_results(tmp_path, BUCKET_FILLS, {"DS_CONFIG": json.dumps(config), "BUCKET": str(bucket)})


@pytest.mark.slow
def test_the_backward_graph_fills_each_gradient_bucket_once(tmp_path):
    """DeepSpeed points each parameter's .grad at its slice of the gradient bucket as it copies the gradient
    in. On XLA that view keeps the bucket as it was then: cut before the bucket's all-reduce, the graph also
    computed, and wrote out, the bucket as it was before the later gradients came in (in bf16 a second
    concatenation of the whole bucket, of fewer pieces; with one bucket for the whole model, one per parameter)."""
    # Buckets of 1,100 elements: the first holds the last layer's bias and weight, then the middle layer's bias.
    config = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1100}, "bf16": {"enabled": True}}
    for rank, graphs in enumerate(bucket_fills(tmp_path, config, 1100)):
        # the graph cut before the first bucket's all-reduce: the forward pass and the last layer's backward
        most = max(matmuls for _, matmuls in graphs)
        first_cut = [versions for versions, matmuls in graphs if matmuls == most]
        assert first_cut and all(versions == 1 for versions in first_cut), (
            f"rank {rank}: the graph cut before the first bucket's all-reduce concatenates {first_cut} versions of "
            "a whole bucket; it fills one bucket, with three gradients, once")


@pytest.mark.slow
def test_gradients_are_flattened_for_the_all_reduce_after_the_backward_graph(tmp_path):
    """Without ZeRO, DeepSpeed flattens the gradients into one bucket (3 layers: 3,168 elements) and all-reduces
    it. Traced into the backward pass's graph, the concatenation made XLA CPU transpose every weight gradient
    twice (4.2M parameters, 2 ranks: 151 against 121 ms per step); the bucket is flattened in a graph of its own."""
    for rank, graphs in enumerate(bucket_fills(tmp_path, {"zero_optimization": {"stage": 0}}, 3168)):
        flattening = [matmuls for fills, matmuls in graphs if fills]
        assert flattening and not any(flattening), (
            f"rank {rank}: the graphs that flatten the gradient bucket hold {flattening} matmuls; the backward "
            "pass, which computes the gradients, is cut before the flattening")


# A child script's one two-rank ZeRO-$STAGE step of a three-layer MLP (3,168 parameters), every parameter
# partitioned: per graph it executes, [matmuls, elements of its outputs].
STEP_OUTPUT_SIZES = EXECUTED_HLO + textwrap.dedent("""
    import json, math, re, torch, deepspeed

    deepspeed.init_distributed()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)])
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": int(os.environ["STAGE"]), "stage3_param_persistence_threshold": 0}})

    def step():
        loss = engine(x.to(engine.device)).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()

    for _ in range(3):
        step()
    graphs = []
    for module in executed_hlo(step).split("HloModule ")[1:]:
        outputs = re.search(r"entry_computation_layout=\\{\\(.*?\\)->\\((.*?)\\)\\}", module).group(1)
        elements = sum(math.prod(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\\[([\\d,]*)\\]", outputs))
        graphs.append([len(re.findall(r" dot\\(", module)), elements])
    with open(os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".json", "w") as f:
        json.dump(graphs, f)
""")


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_two_rank_zero_graphs_write_out_no_views_of_the_gradient_bucket(tmp_path, stage):
    """ZeRO's gradient reduction makes views of the bucket before its all-reduce or reduce-scatter (each
    gradient's partitions, the flattened operand's chunks per rank). Every view alive when the graph is cut is
    an output of its own: cut at the collective's read, the graph holding the backward pass wrote out 6
    (ZeRO-1) and 9 (ZeRO-3) times the model's size per step; cut before the reduction, 2 (ZeRO-1: the bucket
    and each gradient's view of it) and 3 (ZeRO-3). Then, until the optimizer's graph, the step reads the
    reduced gradients' norm: a cut there wrote out each `.grad` view of the reduced bucket (ZeRO-1: 1.8 times
    the model, in the graph that reads one scalar), which the step frees unread."""
    parameters = 3 * (32 * 32 + 32)
    for rank, graphs in enumerate(two_rank_results(tmp_path, STEP_OUTPUT_SIZES, {"STAGE": str(stage)})):
        backward = [i for i, (matmuls, _) in enumerate(graphs) if matmuls]
        assert len(backward) == 1 and graphs[backward[0]][1] < 4 * parameters, (
            f"rank {rank}: ZeRO-{stage}'s graphs holding the backward pass write out "
            f"{[graphs[i][1] for i in backward]} elements; one graph writing fewer than {4 * parameters} (4 times "
            f"the model's {parameters} parameters) was expected")
        between = [elements for _, elements in graphs[backward[0] + 1:-1]]
        assert max(between) <= parameters, (
            f"rank {rank}: ZeRO-{stage}'s graphs between the backward pass's and the optimizer's write out {between} "
            f"elements; at most the model's {parameters} each (the bucket reduced) was expected")


# A child script's steady ZeRO-{stage} training: a two-layer MLP's engine, its step(), three steps done.
STEADY_ZERO_STEPS = EXECUTED_HLO + textwrap.dedent("""
    import json, re, torch, deepspeed

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 8))
    # ZeRO-3 partitions every parameter (by default it keeps ones this small whole on each rank)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={{
        "train_micro_batch_size_per_gpu": 4, "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
        "zero_optimization": {{"stage": {stage}, "stage3_param_persistence_threshold": 0}}}})
    x = torch.randn(4, 24).to(engine.device)

    def step():
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()

    for _ in range(3):
        step()
""")

STEP_GRAPH_OUTPUTS = STEADY_ZERO_STEPS + textwrap.dedent("""
    # the graphs two steady steps execute: the outputs of each
    hlo = executed_hlo(lambda: (step(), step()))
    graphs = re.findall(r"entry_computation_layout=\\{{\\((.*?)\\)->\\((.*?)\\)\\}}", hlo)
    print(json.dumps({{"graph_outputs": [outputs for _, outputs in graphs]}}))
""")

# stage: (graphs per step, what a weight matrix of the model looks like as a graph output: whole under ZeRO-1/2,
# this rank's flat partition under ZeRO-3)
STEP_GRAPHS = {1: (2, r"f32\[(?:40,24|8,40)\]"), 2: (2, r"f32\[(?:40,24|8,40)\]"), 3: (3, r"f32\[(?:960|320)\]")}


@pytest.mark.parametrize("stage", STEP_GRAPHS)
def test_zero_parameters_are_written_out_with_their_flat_buffer_only(tmp_path, stage):
    """ZeRO keeps each parameter (ZeRO-3: each partition) as a view into one flat buffer, which the step
    updates in place. DeepSpeed ends each step by pointing every parameter at a new view of that buffer;
    on XLA each new view was a graph output of its own, a second copy of every parameter written per step."""
    run = run_python(STEP_GRAPH_OUTPUTS.format(stage=stage), "xla",
                     {**single_rank_env(), "GRAPHS_OUT": str(tmp_path / "graphs")})
    graphs = last_json(run)["graph_outputs"]
    per_step, weight = STEP_GRAPHS[stage]
    assert len(graphs) == 2 * per_step, f"two ZeRO-{stage} steps ran {len(graphs)} graphs, expected {per_step} each"
    step_graph_outputs = graphs[-1]  # the graph that ends a step: the optimizer's
    weights = re.findall(weight, step_graph_outputs)
    assert not weights, (f"ZeRO-{stage}: the graph ending a step writes {len(weights)} weight matrices out on their own "
                         f"({step_graph_outputs}); they are views of the flat parameter buffer it already writes")


GRADIENT_PARTITION_READS = STEADY_ZERO_STEPS.format(stage=2) + textwrap.dedent("""
    # where the graph ending a steady step reads each gradient out of the flat gradient partition
    step_graph = executed_hlo(step).split("HloModule ")[-1]
    numel = sum(p.numel() for p in net.parameters())
    reads = re.findall(r"slice\\(f32\\[" + str(numel) + r"\\]\\S* %\\S+\\), slice=.\\[(\\d+):(\\d+)\\]", step_graph)
    print(json.dumps({"reads": sorted([int(a), int(b)] for a, b in reads),
                      "numels": [p.numel() for p in net.parameters()]}))
""")


def test_zero2_step_reads_the_gradient_partition_in_parameter_order(tmp_path):
    """ZeRO-2 copies each reduced gradient into one flat partition buffer as the backward pass reduces it
    (last layer first), and the step reads the gradients back in parameter order: on XLA a reordering
    pass over the whole partition in the step's graph, unless each gradient lies at its parameter's
    offset (zero_buffers.py)."""
    result = last_json(run_python(GRADIENT_PARTITION_READS, "xla", {**single_rank_env(), "GRAPHS_OUT": str(tmp_path / "graphs")}))
    offsets = [0]
    for numel in result["numels"]:
        offsets.append(offsets[-1] + numel)
    in_parameter_order = [[start, end] for start, end in zip(offsets, offsets[1:])]
    assert result["reads"] == in_parameter_order, (
        f"the ZeRO-2 step reads its gradients at {result['reads']} of the flat partition; in parameter order they "
        f"lie at {in_parameter_order}, which the step reads as the buffer it is")


# A child script's three steps of one of the optimizer kernels DeepSpeed loads on XLA ($KERNEL) on fp32 buffers of 12,345
# elements: per graph XLA compiled, the copies of such a buffer it makes.
OPTIMIZER_BUFFER_COPIES = OPTIMIZED_HLO + textwrap.dedent("""
    import json, re, torch, torch_xla
    from deepspeed.ops.op_builder import FusedAdamBuilder, FusedLambBuilder, FusedLionBuilder

    device = torch_xla.device()
    generator = torch.Generator().manual_seed(0)
    grad, param, exp_avg, exp_avg_sq = (torch.randn(12345, generator=generator).to(device) for _ in range(4))
    kernels = {
        "adam": lambda step, grad: FusedAdamBuilder().load().multi_tensor_adam(
            2048, None, [[grad], [param], [exp_avg], [exp_avg_sq]], 1e-3, 0.9, 0.999, 1e-8, step, 1, True, 0.01),
        "lion": lambda step, grad: FusedLionBuilder().load().multi_tensor_lion(
            2048, None, [[grad], [param], [exp_avg]], 1e-3, 0.9, 0.99, step, 0.01),
        "lamb": lambda step, grad: FusedLambBuilder().load().lamb(
            param, torch.empty(0, device=device), exp_avg, exp_avg_sq, grad, 1e-3, 0.9, 0.999, 10.0, 0.01, 1e-8, 1.0,
            step, 0, True, 0.01),
    }
    for step in range(1, 4):
        kernels[os.environ["KERNEL"]](step, grad * step)
        torch_xla.sync()
    copies = [len(re.findall(r"= f32\\[12345\\]\\{0\\} copy\\(", text)) for text in optimized_hlo()]
    print(json.dumps({"copies": copies}))
""")


# Per kernel, the copies of a buffer each step's graph cannot do without: Lion's parameter update reads the momentum
# as it was before the step, after the momentum's update has overwritten that buffer.
NEEDED_BUFFER_COPIES = {"adam": 0, "lion": 1, "lamb": 0}


@pytest.mark.parametrize("kernel", NEEDED_BUFFER_COPIES)
def test_optimizer_kernels_update_their_buffers_in_place(tmp_path, kernel):
    """The step's graph may write each updated buffer (the parameter, the moments) into the buffer it
    read, which PyTorch/XLA donates. Written back with `copy_`, torch_xla 2.9 paired the parameter's new
    value with a moment's buffer, and XLA copied the buffers in every step (3-4 copies per step here; the
    Adam step of a ZeRO-1 fp32 model: 2 copies of the 16 MB partition, 1.15x -> 1.10x the hand loop)."""
    run = run_python(OPTIMIZER_BUFFER_COPIES, "xla", {"KERNEL": kernel, "GRAPHS_OUT": str(tmp_path / "graphs")})
    copies = last_json(run)["copies"]
    needed = NEEDED_BUFFER_COPIES[kernel]
    assert copies and all(count == needed for count in copies), (
        f"{kernel}: the graphs of three optimizer steps copy a whole buffer {copies} times (per graph), where "
        f"{needed} is needed; each update is written into the buffer it replaces")


# Three steps of what the host bridge does with a collective's result: a host tensor made in Python, put on the
# device, copied into the caller's tensor, then a step long enough to be still running when the next one is
# queued. Each step's asynchronous execution releases the previous step's input buffers on an XLA thread.
# Then the exit: torch_xla's exit handler waits for the device with the GIL held.
EXIT_AFTER_PENDING_STEPS = textwrap.dedent("""
    import os, sys, torch, torch_xla
    import torch.utils.dlpack
    from deepspeed_xla.backend import runtime

    ADOPT = {
        "to_device": runtime.to_device,
        # how to_device adopted host tensors before: the Python-owned host tensor itself
        "python_owned": lambda host, device: torch_xla._XLAC._from_dlpack(torch.utils.dlpack.to_dlpack(host)),
    }[os.environ["ADOPT"]]
    device = torch_xla.device()
    target, weights = torch.zeros(1024, 1024).to(device), torch.randn(1024, 1024).to(device)
    torch_xla.sync()
    for step in range(3):
        result = torch.randn(1024, 1024)
        target.copy_(ADOPT(result, device))
        del result
        update = target
        for _ in range(30):
            update = torch.tanh(update @ weights)
        target.add_(update)
        del update
        torch_xla.sync(wait=False)
    print("steps queued", file=sys.stderr, flush=True)
""")
EXIT_GRACE_S = 30  # the exit itself takes about 1 s after the steps are queued


def _exit_after_pending_steps(adopt):
    """Whether a process whose last steps are still running on the device exits: (exited, stderr tail)."""
    env = dict(os.environ, PJRT_DEVICE="CPU", ADOPT=adopt)
    proc = subprocess.Popen([sys.executable, "-c", EXIT_AFTER_PENDING_STEPS], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stderr:  # to the end of the steps, however slow the machine
            lines.append(line)
            if line.startswith("steps queued"):
                break
        assert lines and lines[-1].startswith("steps queued"), f"the steps failed:\n{''.join(lines)[-3000:]}"
        try:
            proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            return False, "".join(lines)[-2000:]
        return proc.returncode == 0, "".join(lines + [proc.stderr.read()])[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        proc.stderr.close()


def test_process_exits_while_steps_that_released_adopted_buffers_are_pending():
    """A run that trained to the end and never exited: XLA released a buffer adopted from a Python-owned host
    tensor on its own thread, which then needed the GIL, held by the main thread in torch_xla's exit handler,
    waiting for that same execution. runtime.to_device hands XLA a copy made in C++, which needs no GIL."""
    exited, log = _exit_after_pending_steps("to_device")
    assert exited, (f"the process did not exit within {EXIT_GRACE_S} s of queueing its last steps (an XLA thread "
                    f"releasing a device buffer waits for the GIL held by the exit handler):\n{log}")


def test_python_owned_adopted_buffers_deadlock_the_exit():
    # The control for the test above: the same steps with the adoption to_device replaced deadlock every time,
    # so that the test above can fail.
    exited, log = _exit_after_pending_steps("python_owned")
    assert not exited, f"the steps with Python-owned adopted buffers exited; the exit test above proves nothing:\n{log}"
