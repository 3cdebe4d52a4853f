"""What XLA cannot run stops in one line naming the alternative (deepspeed_xla/patches/xla_limits.py): sparse
embeddings, fp16 without fp16 arithmetic, compile backends that cannot compile XLA tensors; other uncaught
exceptions keep their traceback."""

import textwrap

import pytest
from helpers import run_python

from harness.launching import single_rank_env

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
