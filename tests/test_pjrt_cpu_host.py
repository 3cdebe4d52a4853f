"""What a PJRT CPU rank gets from the host (deepspeed_xla/backend/host_memory.py, core_binding.py, cpu_compile.py):
freed device buffers stay with the process, each local rank runs on its own cores, XLA compiles its kernels without
LLVM's optimizations, bad settings are refused in one line."""

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import last_json, run_python

from deepspeed_xla.backend import core_binding, cpu_compile, host_memory


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


VECTORIZED_KERNELS = textwrap.dedent("""
    import glob, json, re, sys, torch, deepspeed
    from deepspeed.accelerator import get_accelerator
    x = torch.linspace(-1, 1, 4096, device=get_accelerator().device_name())
    float(((x * 3 + 1).tanh()).sum())
    # XLA's CPU backend writes each fused kernel's LLVM IR after LLVM's passes: a loop LLVM vectorized at
    # level 3 works on <N x float> values; at level 0 LLVM leaves the scalar loop XLA emitted.
    kernels = glob.glob(sys.argv[1] + "/*tanh*ir-with-opt.ll")
    print(json.dumps({"kernels": len(kernels),
                      "vector_ops": sum(len(re.findall(r"<\\d+ x float>", open(k).read())) for k in kernels)}))
""")


@pytest.mark.parametrize("level,vectorized", [(None, False), ("3", True)], ids=["default", "user-level-3"])
def test_a_rank_compiles_without_llvm_optimizations_unless_the_user_sets_a_level(tmp_path, level, vectorized):
    flags = f"--xla_dump_to={tmp_path}" + (f" --xla_backend_optimization_level={level}" if level else "")
    proc = run_python(VECTORIZED_KERNELS.replace("sys.argv[1]", repr(str(tmp_path))), "xla",
                      {"PJRT_DEVICE": "CPU", "XLA_FLAGS": flags})
    report = last_json(proc)
    assert report["kernels"] >= 1, f"{report}: XLA wrote no LLVM IR for the tanh kernel under {tmp_path}"
    assert (report["vector_ops"] > 0) is vectorized, (
        f"{report}: with XLA_FLAGS={flags!r} the rank's kernel was {'' if report['vector_ops'] else 'not '}vectorized "
        f"by LLVM; expected {'level 3 (the user' + chr(39) + 's)' if level else 'level 0 (cpu_compile.py)'}")


@pytest.mark.parametrize("environ", [{"PJRT_DEVICE": "TPU"}, {},
                                     {"PJRT_DEVICE": "CPU", "XLA_FLAGS": "--xla_backend_optimization_level=2"}],
                         ids=["tpu", "unset", "user-level"])
def test_xla_flags_are_left_alone_off_pjrt_cpu_or_when_the_user_set_a_level(environ):
    before = dict(environ)
    assert cpu_compile.compile_quickly(environ) is False
    assert environ == before
