"""The accelerator's range_push/range_pop: profiler ranges that name the ops traced inside them."""

import re
import textwrap

from helpers import last_json, run_python


def test_profiler_ranges_name_the_ops_inside_them_without_looking_for_jax_each_time():
    """range_push/range_pop scope the ops traced between them (HLO metadata, what XLA profiles show);
    DeepSpeed's ZeRO-3 opens about a hundred ranges per step, so entering one must not search sys.path
    for JAX (torch_xla's own Trace does, about 1 ms each time)."""
    code = textwrap.dedent("""
        import json, re, sys, torch, torch_xla, deepspeed
        from deepspeed.accelerator import get_accelerator

        class CountJaxLookups:
            lookups = 0
            def find_spec(self, name, path=None, target=None):
                CountJaxLookups.lookups += name == "jax"
                return None

        sys.meta_path.insert(0, CountJaxLookups())
        accel = get_accelerator()
        x = torch.ones(2, device=torch_xla.device())
        for _ in range(100):
            accel.range_push("warm")
            accel.range_pop()
        accel.range_push("outer")
        accel.range_push("inner")
        y = x * 3
        accel.range_pop()
        accel.range_pop()
        z = y.exp()
        names = re.findall(r'op_name="([^"]*)"', torch_xla._XLAC._get_xla_tensors_hlo([z]))
        print(json.dumps({"mul": sorted({n for n in names if "aten__mul" in n}),
                          "exp": sorted({n for n in names if "aten__exp" in n}), "jax_lookups": CountJaxLookups.lookups}))
    """)
    result = last_json(run_python(code, "xla", {"XLA_HLO_DEBUG": "1"}))
    assert result["mul"] and all(re.match(r"outer[.\d]*/inner[.\d]*/", name) for name in result["mul"]), result
    assert result["exp"] and not any("outer" in name for name in result["exp"]), result
    assert result["jax_lookups"] <= 1, result
