"""DS_ACCELERATOR=xla selects XLA_Accelerator in every process that imports DeepSpeed,
and nothing changes when it is unset or names another accelerator."""

import textwrap

import pytest
from helpers import last_json, run_python

REPORT = textwrap.dedent("""
    import json, sys
    import deepspeed
    from deepspeed.accelerator import get_accelerator, is_current_accelerator_supported
    print(json.dumps({
        "accelerator": type(get_accelerator()).__name__,
        "supported": is_current_accelerator_supported(),
        "torch_xla_imported": "torch_xla" in sys.modules,
        "deepspeed_xla_imported": "deepspeed_xla" in sys.modules,
    }))
""")


def test_ds_accelerator_xla_selects_xla_accelerator():
    result = last_json(run_python(REPORT, "xla"))
    assert result["accelerator"] == "XLA_Accelerator", (
        f"with DS_ACCELERATOR=xla, `import deepspeed` gave {result['accelerator']}: the start-up hook did not act")
    # DeepSpeed's test helpers (skip_on_arch) assert this before running a test on any accelerator but CUDA
    assert result["supported"], "is_current_accelerator_supported() is false with the XLA accelerator installed"


@pytest.mark.parametrize("first", ["deepspeed_xla.accelerator", "deepspeed_xla.op_builder",
                                   "deepspeed_xla.op_builder.torch_native", "deepspeed_xla.op_builder.registry"])
def test_a_script_may_import_the_accelerator_before_deepspeed(first):
    """DeepSpeed builds the accelerator and binds its op builders while it is being imported. A script that
    imported one of these modules first (`from deepspeed_xla.accelerator import XLA_Accelerator`, then
    `import deepspeed`) made DeepSpeed build them from a module still half loaded: a circular ImportError."""
    code = textwrap.dedent(f"""
        import json
        import {first}
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from deepspeed.ops.op_builder import FusedAdamBuilder
        from deepspeed_xla.accelerator import XLA_Accelerator
        from deepspeed_xla.op_builder import torch_native
        print(json.dumps({{"xla_accelerator": isinstance(get_accelerator(), XLA_Accelerator),
                           "torch_native_adam": FusedAdamBuilder().load() is torch_native.fused_adam}}))
    """)
    result = last_json(run_python(code, "xla"))
    assert result == {"xla_accelerator": True, "torch_native_adam": True}, (
        f"importing {first} before deepspeed (DS_ACCELERATOR=xla) gave {result}")


@pytest.mark.parametrize("accelerator", [None, "cpu"], ids=["unset", "cpu"])
def test_other_values_leave_deepspeed_untouched(accelerator):
    result = last_json(run_python(REPORT, accelerator))
    assert result["accelerator"] == "CPU_Accelerator", (
        f"DS_ACCELERATOR={accelerator}: DeepSpeed chose {result['accelerator']}, expected its own CPU_Accelerator")
    assert not result["torch_xla_imported"], f"DS_ACCELERATOR={accelerator}: torch_xla was imported anyway"
    assert not result["deepspeed_xla_imported"], f"DS_ACCELERATOR={accelerator}: deepspeed_xla was imported anyway"


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_multiprocessing_children_get_xla_accelerator(start_method, tmp_path):
    code = textwrap.dedent(f"""
        import json, multiprocessing as mp

        def child(queue):
            import deepspeed
            from deepspeed.accelerator import get_accelerator
            queue.put(type(get_accelerator()).__name__)

        if __name__ == "__main__":
            ctx = mp.get_context("{start_method}")
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue,))
            proc.start()
            name = queue.get(timeout=120)
            proc.join()
            print(json.dumps({{"accelerator": name, "exitcode": proc.exitcode}}))
    """)
    result = last_json(run_python(code, "xla", script=tmp_path / "parent.py"))
    assert result == {"accelerator": "XLA_Accelerator", "exitcode": 0}, (
        f"a {start_method} child of a DS_ACCELERATOR=xla process got {result}")


def test_launcher_parent_counts_devices_without_initialising_runtime():
    # What DeepSpeed's runner does before starting workers: import it, ask device_count().
    code = textwrap.dedent("""
        import json
        import deepspeed.launcher.runner
        from deepspeed.accelerator import get_accelerator
        import torch_xla
        accelerator = get_accelerator()
        print(json.dumps({"accelerator": type(accelerator).__name__,
                          "device_count": accelerator.device_count(),
                          "is_available": accelerator.is_available(),
                          "runtime_initialized": torch_xla._XLAC._xla_runtime_is_initialized()}))
    """)
    result = last_json(run_python(code, "xla", {"DS_XLA_CPU_DEVICES": "4"}))
    assert result == {"accelerator": "XLA_Accelerator", "device_count": 4, "is_available": True,
                      "runtime_initialized": False}, f"launcher parent view: {result}"


def test_missing_torch_xla_gives_one_line_and_nonzero_exit(tmp_path):
    # Shadow torch_xla with a package that fails to import, as on a machine without it.
    shadow = tmp_path / "shadow" / "torch_xla"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'torch_xla'\")\n")
    proc = run_python("import deepspeed", "xla", {"PYTHONPATH": str(tmp_path / "shadow")})
    assert proc.returncode != 0, "import deepspeed succeeded with DS_ACCELERATOR=xla and no torch_xla"
    lines = [line for line in proc.stderr.strip().splitlines() if "Warning" not in line]
    assert "Traceback" not in proc.stderr, f"expected one line, got a traceback:\n{proc.stderr}"
    assert len(lines) == 1 and "pip install" in lines[0] and "torch_xla" in lines[0], (
        f"expected one line saying what to install, got:\n{proc.stderr}")


def test_activate_installs_before_deepspeed_binds_op_builders():
    code = textwrap.dedent("""
        import json
        import deepspeed_xla
        accelerator = deepspeed_xla.activate()
        from deepspeed.ops.op_builder import FusedAdamBuilder
        print(json.dumps({"accelerator": type(accelerator).__name__, "builder": FusedAdamBuilder.__module__}))
    """)
    result = last_json(run_python(code, None))
    assert result == {"accelerator": "XLA_Accelerator", "builder": "deepspeed_xla.op_builder.builder"}, (
        f"deepspeed_xla.activate() gave {result}: DeepSpeed's optimizers would not get the XLA kernels")


def test_activate_after_deepspeed_import_is_a_clear_error():
    proc = run_python("import deepspeed, deepspeed_xla\ndeepspeed_xla.activate()", None)
    assert proc.returncode != 0 and "DeepSpeed was imported before the XLA accelerator" in proc.stderr, (
        f"activate() after `import deepspeed` must refuse with a reason; got exit {proc.returncode}:\n"
        f"{proc.stderr[-2000:]}")


@pytest.mark.parametrize("setting, expected", [(None, "default"), ("highest", "highest"), ("HIGH", "high")])
def test_matmul_precision_follows_ds_xla_matmul_precision(setting, expected):
    """TPUs multiply fp32 in bf16 passes unless told otherwise: DS_XLA_MATMUL_PRECISION tells them."""
    code = ("import json, deepspeed, torch_xla.backends\n"
            "print(json.dumps({'precision': torch_xla.backends.get_mat_mul_precision()}))")
    env = {} if setting is None else {"DS_XLA_MATMUL_PRECISION": setting}
    assert last_json(run_python(code, "xla", env))["precision"] == expected


def test_a_bad_matmul_precision_is_refused_naming_the_variable():
    proc = run_python("import deepspeed", "xla", {"DS_XLA_MATMUL_PRECISION": "fast"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("deepspeed_xla: DS_XLA_MATMUL_PRECISION='fast': expected default, "
                                                    "high or highest")
