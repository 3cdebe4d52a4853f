"""Parameters that an optimizer updates through `p.data` (DeepSpeed's fused optimizers) are current when its step
returns (deepspeed_xla.patches.optimizer_aliases), on a real PJRT CPU device."""

import json
import textwrap

import pytest
import torch
import torch_xla
from helpers import last_json, run_python

from deepspeed_xla.patches import optimizer_aliases
from harness.launching import single_rank_env

XLA = torch_xla.device()


class ThroughData(torch.optim.Optimizer):
    """Updates each parameter as DeepSpeed's FusedAdam hands it to its kernel: through `p.data`."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self):
        for group in self.param_groups:
            for param in group["params"]:
                param.data.add_(1.0)


def test_a_view_taken_after_the_step_sees_the_update():
    optimizer_aliases.install()
    flat = torch.zeros(6, device=XLA)
    torch_xla.sync()
    ThroughData([flat]).step()
    torch_xla.sync()  # runs the update; torch_xla reuses the old value's buffer for it
    head = flat.narrow(0, 0, 2)  # a ZeRO fragment of an fp32 master partition is such a view
    torch_xla.sync()  # computed the view from the old, deleted buffer
    assert head.cpu().tolist() == [1.0, 1.0]
    assert flat.cpu().tolist() == [1.0] * 6


# Two steps, a checkpoint, a third step, the checkpoint loaded in the same process (back to two steps), the third
# step again, the bf16 parameters offloaded and reloaded, a fourth step: the losses of four plain steps.
SCRIPT = textwrap.dedent("""
    import json, os, sys, torch, deepspeed
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum
    stage, checkpoint = int(os.environ["ZERO_STAGE"]), os.environ.get("CHECKPOINT")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
        "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}})
    batches = [torch.randn(2, 8).bfloat16().to(engine.device) for _ in range(4)]
    def step(x):
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        return loss.item()
    if checkpoint is None:
        print(json.dumps([step(x) for x in batches]))
        sys.exit()
    losses = [step(x) for x in batches[:2]]
    engine.save_checkpoint(checkpoint, tag="two")
    step(batches[2])
    engine.load_checkpoint(checkpoint, tag="two")
    losses.append(step(batches[2]))
    engine.offload_states(include=[OffloadStateTypeEnum.lp_params])
    engine.reload_states()
    losses.append(step(batches[3]))
    print(json.dumps(losses))
""")


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_load_checkpoint_and_offloading_parameters_in_process_keep_the_losses(stage, tmp_path):
    # ZeRO-1/2 re-link their fp32 master fragments (views of the partition) after either call: the next step's
    # graph read the partition's donated buffer ("buffer with shape f32[212] ... is deleted").
    runs = {}
    for name, extra in (("plain", {}), ("reloaded", {"CHECKPOINT": str(tmp_path / "checkpoint")})):
        env = {**single_rank_env(), "ZERO_STAGE": str(stage), **extra}
        runs[name] = last_json(run_python(SCRIPT, "xla", env))
    assert runs["reloaded"] == runs["plain"], json.dumps(runs)
