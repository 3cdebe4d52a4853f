"""DeepSpeed's device mesh on XLA (patches/device_mesh.py): a config with data and sequence parallel sizes
(Ulysses) builds a mesh whose dimension groups exist and reduce across the right ranks."""

import json
import textwrap

import pytest

from harness.candidate.candidates import parse_spec
from harness.launching import launch

CHILD = textwrap.dedent("""
    import json, os
    import torch, deepspeed
    import deepspeed.comm as dist
    from deepspeed.utils import groups
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 4), config={
        "train_batch_size": 2, "data_parallel_size": 1, "sequence_parallel_size": 2})
    sequence, data = engine.seq_parallel_group, groups._get_data_parallel_group()
    value = torch.tensor([float(dist.get_rank() + 1)], device=engine.device)
    dist.all_reduce(value, group=sequence)
    with open(os.environ["MESH_OUT"] + "." + os.environ["RANK"] + ".json", "w") as f:
        json.dump({"mesh": groups.mesh_device.mesh.tolist(), "names": list(groups.mesh_device.mesh_dim_names),
                   "sequence_ranks": dist.get_world_size(group=sequence), "data_ranks": dist.get_world_size(group=data),
                   "sequence_sum": value.item()}, f)
""")


@pytest.mark.slow
def test_a_data_and_sequence_parallel_mesh_has_working_groups(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run = launch([script], parse_spec("deepspeed_xla"), tmp_path, num_gpus=2, env={"MESH_OUT": str(tmp_path / "out")},
                 timeout=300)
    # without the patch: "DeviceMesh process groups not initialized!" in deepspeed.initialize
    assert run.returncode == 0 and not run.timed_out, run.log[-3000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"out.{rank}.json").read_text())
        assert result == {"mesh": [[0, 1]], "names": ["data_parallel", "sequence_parallel"], "sequence_ranks": 2,
                          "data_ranks": 1, "sequence_sum": 3.0}, f"rank {rank}: {result}"
