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


def test_checkpoint_saved_with_states_offloaded_equals_one_saved_on_the_device(tmp_path):
    """RLHF loops save between `offload_states()` and `reload_states()`. DeepSpeed's host buffers for the offloaded
    states are made with `empty_like(x, device="cpu")`, which torch 2.9 returned without storage for an XLA `x`:
    torch.save failed ("invalid python storage"). The checkpoint saved offloaded must hold exactly what one saved
    after the reload holds."""
    code = textwrap.dedent(f"""
        import json, torch, deepspeed
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={{
            "train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "Adam", "params": {{"lr": 0.01}}}},
            "bf16": {{"enabled": True}}, "zero_optimization": {{"stage": 2}}}})
        x = torch.randn(2, 8).to(engine.device).bfloat16()
        for _ in range(2):
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
        engine.offload_states()
        engine.save_checkpoint({str(tmp_path)!r}, tag="offloaded")
        engine.reload_states()
        engine.save_checkpoint({str(tmp_path)!r}, tag="resident")
        print(json.dumps({{"saved": True}}))
    """)
    assert last_json(run_python(code, "xla", single_rank_env()))["saved"]
    compare = textwrap.dedent(f"""
        import json, pathlib, torch
        from torch.utils._pytree import keystr, tree_flatten_with_path
        def tensors(path):
            leaves = tree_flatten_with_path(torch.load(path, weights_only=False))[0]
            return {{keystr(key): leaf for key, leaf in leaves if torch.is_tensor(leaf)}}
        root = pathlib.Path({str(tmp_path)!r})
        files = sorted(p.name for p in (root / "resident").glob("*.pt"))
        differ = []
        count = 0
        for name in files:
            saved, kept = tensors(root / "offloaded" / name), tensors(root / "resident" / name)
            count += len(kept)
            differ += [f"{{name}}{{key}}" for key in kept.keys() | saved.keys()
                       if key not in saved or key not in kept or not torch.equal(saved[key], kept[key])]
        print(json.dumps({{"files": files, "tensors": count, "differ": differ}}))
    """)
    result = last_json(run_python(compare, "cpu"))
    # The module's 4 parameters; the fp32 master partition and Adam's two moments.
    assert len(result["files"]) == 2 and result["tensors"] == 7, result
    assert not result["differ"], f"the checkpoint saved offloaded differs in {result['differ']}"
