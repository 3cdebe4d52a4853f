"""Checkpoints saved on XLA (deepspeed_xla/patches/checkpointing.py): they hold host tensors, and tied parameters
are told by identity, so zero_to_fp32 consolidates them."""

import textwrap

from helpers import last_json, run_python

from harness.launching import single_rank_env


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
