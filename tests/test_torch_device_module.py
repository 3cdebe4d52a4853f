"""`torch.xla`, the device runtime module torch.utils.checkpoint looks up (deepspeed_xla/patches/
torch_device_module.py): a recomputed forward replays its dropout masks and leaves the random stream as an
uncheckpointed run does."""

import textwrap

from helpers import last_json, run_python

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
