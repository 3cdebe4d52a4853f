"""A CPU backward pass before training leaves XLA's autograd working (deepspeed_xla/patches/backward_guard.py),
in a fresh interpreter as a user script would start."""


import pytest
from helpers import last_json, run_python


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
