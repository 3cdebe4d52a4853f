"""Under DS_ACCELERATOR=xla, transformers and Accelerate see DeepSpeed's world (deepspeed_xla/patches/huggingface.py);
without it, nothing of theirs changes. Multi-rank Trainer and Accelerate training against the CPU reference is
the conformance area `huggingface` (conformance/test_huggingface_training.py)."""

import pytest
from helpers import last_json, run_python

from deepspeed_xla.patches import huggingface

LAUNCHED = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")

STATE = """
import json, os
import transformers.utils.import_utils as hf_imports
import transformers.modeling_utils as hf_modeling
import accelerate.utils as accelerate_utils
from accelerate.state import PartialState
os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
state = PartialState()
print(json.dumps({"transformers_xla": hf_imports.is_torch_xla_available(), "hub_kernels": hf_modeling._kernels_enabled(),
                  "accelerate_xla": accelerate_utils.is_torch_xla_available(),
                  "distributed_type": str(state.distributed_type), "backend": state.backend,
                  "device": str(state.device), "processes": state.num_processes}))
"""


@pytest.fixture
def launched(unused_port):
    return dict(LAUNCHED, MASTER_PORT=str(unused_port))


@pytest.fixture
def unused_port():
    from harness.launching import free_port
    return free_port()


def test_deepspeed_runs_get_deepspeeds_backend_and_device(launched):
    state = last_json(run_python(STATE, "xla", launched))
    assert state == {"transformers_xla": False, "hub_kernels": False, "accelerate_xla": False,
                     "distributed_type": "DistributedType.DEEPSPEED", "backend": "xla_ds", "device": "xla:0", "processes": 1}


def test_nothing_changes_without_ds_accelerator(launched):
    code = ("import json, transformers.utils.import_utils as t, accelerate.utils as a\n"
            "print(json.dumps([t.is_torch_xla_available(), a.is_torch_xla_available()]))")
    assert last_json(run_python(code, None, launched)) == [True, True]


def test_a_launched_run_without_deepspeed_stops_with_one_line(launched):
    code = "from accelerate.state import PartialState\nPartialState()"
    proc = run_python(code, "xla", dict(launched, WORLD_SIZE="2", ACCELERATE_USE_DEEPSPEED="false"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "deepspeed_xla: a multi-process transformers/Accelerate run without DeepSpeed under DS_ACCELERATOR=xla")


def test_an_untested_major_version_stops_with_one_line(monkeypatch):
    monkeypatch.setattr(huggingface.importlib.metadata, "version", lambda name: "6.0.1")
    with pytest.raises(SystemExit, match=r"^deepspeed_xla: transformers 6\.0\.1 is not supported under DS_ACCELERATOR=xla "
                                         r"\(tested with transformers 5\.x\)"):
        huggingface.check_version("transformers")
    monkeypatch.setattr(huggingface.importlib.metadata, "version", lambda name: "5.25.0")
    huggingface.check_version("transformers")


def test_trainer_takes_bf16_where_the_accelerator_has_it(launched, tmp_path):
    # with torch_xla hidden, transformers finds no bf16 device: "Your setup doesn't support bf16/gpu"
    code = ("import json, transformers\n"
            "config = {'zero_optimization': {'stage': 2}, 'bf16': {'enabled': 'auto'}}\n"
            f"args = transformers.TrainingArguments(output_dir={str(tmp_path)!r}, bf16=True, deepspeed=config, report_to=[])\n"
            "print(json.dumps([args.bf16, str(args.device)]))")
    assert last_json(run_python(code, "xla", launched)) == [True, "xla:0"]


def test_trainer_default_adamw_runs_unfused_on_xla_only(launched, tmp_path):
    # torch's fused AdamW (TrainingArguments' default on torch >= 2.8) refuses XLA parameters; the conformance
    # case trainer-default-optimizer-llama-zero2-2rank trains with it
    code = ("import json, transformers\n"
            f"default = transformers.TrainingArguments(output_dir={str(tmp_path)!r}, report_to=[])\n"
            f"chosen = transformers.TrainingArguments(output_dir={str(tmp_path)!r}, report_to=[], optim='adafactor')\n"
            "print(json.dumps([str(default.optim.value), str(chosen.optim.value)]))")
    assert last_json(run_python(code, "xla", launched)) == ["adamw_torch", "adafactor"]
    assert last_json(run_python(code, "cpu", launched)) == ["adamw_torch_fused", "adafactor"]
