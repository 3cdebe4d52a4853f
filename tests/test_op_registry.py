"""DeepSpeed's op registry and `ds_report` under DS_ACCELERATOR=xla: every DeepSpeed op listed with its
compatibility (deepspeed_xla/op_builder/)."""

import textwrap

from helpers import deepspeed_source_layout, last_json, run_python


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
        "cpu_lion": True, "quantizer": True, "transformer": False, "transformer_inference": False}.items()
        if ops.get(name) is not want}
    assert not wrong, f"__compatible_ops__ under XLA has the wrong compatibility for {wrong}"


def test_ds_report_lists_the_ops():
    proc = run_python("from deepspeed.env_report import main; main()", "xla")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("fused_adam", "cpu_adam", "transformer_inference"):
        assert any(line.startswith(f"{name} .") for line in proc.stdout.splitlines()), f"ds_report does not list {name}"


def test_a_deepspeed_source_layout_gets_its_own_host_builders_and_one_accelerator(tmp_path):
    """A DeepSpeed source checkout on sys.path (as DeepSpeed's tests/conftest.py puts it), or an editable install,
    also has DeepSpeed's `op_builder` and `accelerator` as top-level packages (in the repository,
    deepspeed/ops/op_builder and deepspeed/accelerator link to them).
    - DeepSpeed's CPU builders import `op_builder` while `deepspeed.ops.op_builder.cpu` is half imported: the
      host-side builders must come from `op_builder.cpu`, as DeepSpeed's own accelerators take them, or
      `import deepspeed` fails with a circular import.
    - DeepSpeed's op builders import `accelerator` before `deepspeed.accelerator`, which loads a second copy of
      real_accelerator: it must hold the same XLA accelerator, or it refuses DS_ACCELERATOR=xla at the first op
      lookup ("DS_ACCELERATOR must be one of ...")."""
    code = textwrap.dedent("""
        import json, sys
        import deepspeed.comm, deepspeed.ops
        from deepspeed.accelerator import get_accelerator
        ops = deepspeed.ops.__compatible_ops__
        copy = sys.modules.get("accelerator.real_accelerator")
        print(json.dumps({"ops": ops, "host_side": get_accelerator().get_op_builder("CPUAdamBuilder").__module__,
                          "copy_loaded": copy is not None,
                          "one_accelerator": copy is not None and copy.get_accelerator() is get_accelerator(),
                          "copy_supports_it": copy is not None and copy.is_current_accelerator_supported()}))
    """)
    wheel = last_json(run_python(code, "xla"))
    source = last_json(run_python(code, "xla", deepspeed_source_layout(tmp_path)))
    assert source["host_side"] == "op_builder.cpu.cpu_adam" and wheel["host_side"] != source["host_side"]
    assert source["copy_loaded"] and not wheel["copy_loaded"], "the op builders did not load the top-level copy"
    assert source["one_accelerator"] and source["copy_supports_it"], \
        f"the top-level copy of real_accelerator holds another accelerator: {source}"
    assert source["ops"] == wheel["ops"], "the source layout lists other ops, or other compatibilities, than the wheel"
