"""XLA tensors that require grad survive pickling and torch.save/torch.load (deepspeed_xla/patches/tensor_pickling.py):
they come back leaves on the XLA device, with their values and requires_grad."""

import pytest
from helpers import last_json, run_python

ROUND_TRIPS = """
import io, json, pickle, torch, deepspeed
from deepspeed.accelerator import get_accelerator
device = get_accelerator().current_device_name()
x = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
x.requires_grad = True
def saved_and_loaded(t):
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)
report = {}
for name, copy in (("pickle", pickle.loads(pickle.dumps(x))), ("torch.load", saved_and_loaded(x)),
                   ("frozen", pickle.loads(pickle.dumps(x.detach())))):
    report[name] = {"device": copy.device.type, "leaf": copy.is_leaf, "requires_grad": copy.requires_grad,
                    "values": copy.detach().cpu().tolist()}
print(json.dumps(report))
"""


@pytest.mark.parametrize("route", ["pickle", "torch.load", "frozen"])
def test_an_xla_tensor_comes_back_a_leaf_with_its_values_and_requires_grad(route):
    copy = last_json(run_python(ROUND_TRIPS, "xla", {"PJRT_DEVICE": "CPU"}))[route]
    assert copy == {"device": "xla", "leaf": True, "requires_grad": route != "frozen",
                    "values": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]}, copy
