"""The graphs a training step executes on XLA, read from the executed and optimized HLO (deepspeed_xla/patches/
step_graphs.py, zero_param_views.py, zero_buffers.py, op_builder/): a pipeline step compiles nothing after
warm-up, a two-rank ZeRO-2 step runs its forward and backward passes once, each gradient bucket is filled once,
no view of a bucket is written out, parameters are written out only as their flat buffer, the gradient partition
is read in parameter order, and the optimizer kernels update their buffers in place."""

import json
import re
import textwrap
import types

import pytest
import torch
import torch_xla
from helpers import last_json, run_python

from deepspeed_xla.backend import runtime
from deepspeed_xla.patches import step_graphs

from harness.candidate.candidates import parse_spec
from harness.launching import launch, single_rank_env
from harness.paths import REPO

XLA = torch_xla.device()


def test_pipeline_steps_compile_nothing_after_warm_up():
    """PipelineEngine.train_batch takes its optimizer step without engine.step(); an fp32 step without
    ZeRO reads nothing on the host, so unless the step ends in a sync each update stays pending and
    the next step's graph holds all of them: one more compilation every step, each step slower."""
    code = textwrap.dedent("""
        import json, torch, deepspeed
        import torch_xla.debug.metrics as metrics
        from deepspeed.pipe import PipelineModule
        deepspeed.init_distributed()
        torch.manual_seed(0)
        model = PipelineModule(layers=[torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)], num_stages=1,
                               loss_fn=torch.nn.MSELoss())
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "steps_per_print": 1000})
        g = torch.Generator().manual_seed(1)
        def batches():
            while True:
                yield torch.randn(4, 8, generator=g).to(engine.device), torch.randn(4, 4, generator=g).to(engine.device)
        data, compilations = batches(), []
        for _ in range(6):
            engine.train_batch(data_iter=data).item()
            compilations.append((metrics.metric_data("CompileTime") or [0])[0])
        print(json.dumps(compilations))
    """)
    compilations = last_json(run_python(code, "xla", single_rank_env()))
    # the first two steps compile (optimizer state made, then the steady step); none after
    assert compilations[2:] == [compilations[2]] * 4, f"compilations after each pipeline step: {compilations}"


# A child script's start: the graphs it executes go to $GRAPHS_OUT.<rank>.hlo*, and executed_hlo(run) is the
# HLO of those `run()` executes. torch_xla reads the setting at its first graph, so this comes before any import.
EXECUTED_HLO = textwrap.dedent("""
    import glob, os
    out = os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".hlo"
    os.environ.update(XLA_SAVE_TENSORS_FILE=out, XLA_SAVE_TENSORS_FMT="hlo")

    def executed_hlo(run):
        dump = glob.glob(out + "*")
        start = os.path.getsize(dump[0]) if dump else 0
        run()
        with open(glob.glob(out + "*")[0]) as f:
            f.seek(start)
            return f.read()
""")

ONE_STEP_MATMULS = EXECUTED_HLO + textwrap.dedent("""
    import json, re, torch, deepspeed, torch_xla

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)])

    def matmuls_of(step):
        return len(re.findall(r" dot\\(", executed_hlo(step)))

    deepspeed.init_distributed()
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
    net = model()
    # Buckets of one layer each: the backward pass reduces three of them, then the step reads the norm.
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 1100}})

    def deepspeed_step():
        loss = engine(x.to(engine.device)).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()

    hand = model().to(engine.device)
    optimizer = torch.optim.AdamW(hand.parameters(), lr=0.01)

    def hand_step():
        loss = hand(x.to(engine.device)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch_xla.sync()
        loss.item()

    for _ in range(2):
        deepspeed_step()
        hand_step()
    with open(os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".json", "w") as f:
        json.dump({"deepspeed": matmuls_of(deepspeed_step), "hand": matmuls_of(hand_step)}, f)
""")


def two_rank_results(tmp_path, source, env=None):
    """Run child script `source` as two ranks under DeepSpeed's launcher on deepspeed_xla, with `env` added to
    the environment; per rank, the JSON it wrote to $GRAPHS_OUT.<rank>.json."""
    script = tmp_path / "child.py"
    script.write_text(source)
    run = launch([script], parse_spec("deepspeed_xla"), tmp_path, num_gpus=2,
                 env={"GRAPHS_OUT": str(tmp_path / "out"), **(env or {})},
                 timeout=300)
    assert run.returncode == 0 and not run.timed_out, run.log[-3000:]
    return [json.loads((tmp_path / f"out.{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_a_two_rank_zero2_step_runs_its_forward_and_backward_passes_once(tmp_path):
    """The host bridge reads each gradient bucket's reduction on the host. Reading only the bucket
    left the forward and backward passes pending, and every later read (the next bucket, the norm,
    the loss) ran them again: the step's graphs held the model's matmuls once per read."""
    for rank, counts in enumerate(two_rank_results(tmp_path, ONE_STEP_MATMULS)):
        assert counts["deepspeed"] == counts["hand"], (
            f"rank {rank}: one ZeRO-2 step executed {counts['deepspeed']} matmuls, a hand-written step "
            f"{counts['hand']}: part of the forward and backward passes ran more than once")


# Prelude of a child script: XLA dumps the optimised HLO of every graph it compiles (under $GRAPHS_OUT.<rank>);
# optimized_hlo() returns their texts in the order they were compiled.
OPTIMIZED_HLO = textwrap.dedent("""
    import glob, os
    dump = os.environ["GRAPHS_OUT"] + "." + os.environ.get("RANK", "0")
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=" + dump

    def optimized_hlo():
        return [open(path).read() for path in sorted(glob.glob(dump + "/*after_optimizations.txt"))]
""")

# Optimised HLO of every graph a two-rank run of a three-layer MLP compiles, under the DeepSpeed config entries in
# $DS_CONFIG (JSON): per graph, how many versions of a whole gradient bucket of $BUCKET elements it concatenates
# (distinct lists of pieces: XLA may repeat one concatenation inside each fusion that reads it), and its matmuls.
BUCKET_FILLS = OPTIMIZED_HLO + textwrap.dedent("""
    import json, re, torch, deepspeed

    deepspeed.init_distributed()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)])
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
    config = json.loads(os.environ["DS_CONFIG"])
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, **config})
    dtype = torch.bfloat16 if config.get("bf16", {}).get("enabled") else torch.float32
    for _ in range(4):
        loss = engine(x.to(engine.device, dtype)).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()
    graphs = []
    bucket = re.escape("[" + os.environ["BUCKET"] + "]{0} concatenate(") + r"([^)]*)\\)"
    for text in optimized_hlo():
        versions = {re.sub(r"\\.\\d+", "", pieces) for pieces in re.findall(bucket, text)}
        graphs.append([len(versions), len(re.findall(r" dot\\(", text))])
    with open(dump + ".json", "w") as f:
        json.dump(graphs, f)
""")


def bucket_fills(tmp_path, config, bucket):
    """Per rank, per graph of a two-rank BUCKET_FILLS run: [versions of a whole `bucket` concatenated, matmuls]."""
    return two_rank_results(tmp_path, BUCKET_FILLS, {"DS_CONFIG": json.dumps(config), "BUCKET": str(bucket)})


@pytest.mark.slow
def test_the_backward_graph_fills_each_gradient_bucket_once(tmp_path):
    """DeepSpeed points each parameter's .grad at its slice of the gradient bucket as it copies the gradient
    in. On XLA that view keeps the bucket as it was then: cut before the bucket's all-reduce, the graph also
    computed, and wrote out, the bucket as it was before the later gradients came in (in bf16 a second
    concatenation of the whole bucket, of fewer pieces; with one bucket for the whole model, one per parameter)."""
    # Buckets of 1,100 elements: the first holds the last layer's bias and weight, then the middle layer's bias.
    config = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1100}, "bf16": {"enabled": True}}
    for rank, graphs in enumerate(bucket_fills(tmp_path, config, 1100)):
        # the graph cut before the first bucket's all-reduce: the forward pass and the last layer's backward
        most = max(matmuls for _, matmuls in graphs)
        first_cut = [versions for versions, matmuls in graphs if matmuls == most]
        assert first_cut and all(versions == 1 for versions in first_cut), (
            f"rank {rank}: the graph cut before the first bucket's all-reduce concatenates {first_cut} versions of "
            "a whole bucket; it fills one bucket, with three gradients, once")


@pytest.mark.slow
def test_gradients_are_flattened_for_the_all_reduce_after_the_backward_graph(tmp_path):
    """Without ZeRO, DeepSpeed flattens the gradients into one bucket (3 layers: 3,168 elements) and all-reduces
    it. Traced into the backward pass's graph, the concatenation made XLA CPU transpose every weight gradient
    twice (4.2M parameters, 2 ranks: 151 against 121 ms per step); the bucket is flattened in a graph of its own."""
    for rank, graphs in enumerate(bucket_fills(tmp_path, {"zero_optimization": {"stage": 0}}, 3168)):
        flattening = [matmuls for fills, matmuls in graphs if fills]
        assert flattening and not any(flattening), (
            f"rank {rank}: the graphs that flatten the gradient bucket hold {flattening} matmuls; the backward "
            "pass, which computes the gradients, is cut before the flattening")


# A child script's one two-rank ZeRO-$STAGE step of a three-layer MLP (3,168 parameters), every parameter
# partitioned: per graph it executes, [matmuls, elements of its outputs].
STEP_OUTPUT_SIZES = EXECUTED_HLO + textwrap.dedent("""
    import json, math, re, torch, deepspeed

    deepspeed.init_distributed()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(3)])
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={
        "train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "zero_optimization": {"stage": int(os.environ["STAGE"]), "stage3_param_persistence_threshold": 0}})

    def step():
        loss = engine(x.to(engine.device)).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()

    for _ in range(3):
        step()
    graphs = []
    for module in executed_hlo(step).split("HloModule ")[1:]:
        outputs = re.search(r"entry_computation_layout=\\{\\(.*?\\)->\\((.*?)\\)\\}", module).group(1)
        elements = sum(math.prod(int(d) for d in dims.split(",") if d) for dims in re.findall(r"\\[([\\d,]*)\\]", outputs))
        graphs.append([len(re.findall(r" dot\\(", module)), elements])
    with open(os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".json", "w") as f:
        json.dump(graphs, f)
""")


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_two_rank_zero_graphs_write_out_no_views_of_the_gradient_bucket(tmp_path, stage):
    """ZeRO's gradient reduction makes views of the bucket before its all-reduce or reduce-scatter (each
    gradient's partitions, the flattened operand's chunks per rank). Every view alive when the graph is cut is
    an output of its own: cut at the collective's read, the graph holding the backward pass wrote out 6
    (ZeRO-1) and 9 (ZeRO-3) times the model's size per step; cut before the reduction, 2 (ZeRO-1: the bucket
    and each gradient's view of it) and 3 (ZeRO-3). Then, until the optimizer's graph, the step reads the
    reduced gradients' norm: a cut there wrote out each `.grad` view of the reduced bucket (ZeRO-1: 1.8 times
    the model, in the graph that reads one scalar), which the step frees unread."""
    parameters = 3 * (32 * 32 + 32)
    for rank, graphs in enumerate(two_rank_results(tmp_path, STEP_OUTPUT_SIZES, {"STAGE": str(stage)})):
        backward = [i for i, (matmuls, _) in enumerate(graphs) if matmuls]
        assert len(backward) == 1 and graphs[backward[0]][1] < 4 * parameters, (
            f"rank {rank}: ZeRO-{stage}'s graphs holding the backward pass write out "
            f"{[graphs[i][1] for i in backward]} elements; one graph writing fewer than {4 * parameters} (4 times "
            f"the model's {parameters} parameters) was expected")
        between = [elements for _, elements in graphs[backward[0] + 1:-1]]
        assert max(between) <= parameters, (
            f"rank {rank}: ZeRO-{stage}'s graphs between the backward pass's and the optimizer's write out {between} "
            f"elements; at most the model's {parameters} each (the bucket reduced) was expected")


# A child script's two-rank ZeRO-3 training of 16 elementwise-scale parameters sharing 2,400 bf16 weights, as in
# DeepSpeed's TestZero3ParamPartitioningManyParams (each small enough to stay gathered between steps): per graph a
# steady step executes, whether it computes the rank's updated bf16 partition (1,200 weights, converted from the fp32
# master partition) and its HLO instructions.
MANY_PARAMS_STEP = EXECUTED_HLO + f"import sys\nsys.path.insert(0, {str(REPO / 'fixtures')!r})\n" + textwrap.dedent("""
    import json, re, torch, deepspeed
    from many_params import CONFIG, build

    deepspeed.init_distributed()
    net = build(16, 150)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=CONFIG)

    def step():
        loss = engine(torch.ones(1, 150, device=engine.device, dtype=torch.bfloat16)).float().sum()
        engine.backward(loss)
        engine.step()

    for _ in range(2):
        step()
    graphs = [[" bf16[1200]{0} convert(" in module, len(re.findall(r"^\\s+\\S+ = ", module, re.M))]
              for module in executed_hlo(step).split("HloModule ")[1:]]
    with open(os.environ["GRAPHS_OUT"] + "." + os.environ["RANK"] + ".json", "w") as f:
        json.dump(graphs, f)
""")


@pytest.mark.slow
def test_a_zero3_step_computes_the_update_once_before_gathering_persistent_parameters(tmp_path):
    """ZeRO-3 ends its step by gathering each persistent parameter from the partition buffer the update has just
    written, one collective per parameter. Through the host bridge each gather's read computed the whole update again
    for its slice: one graph of every parameter's update per parameter, each compiled anew, quadratic in the
    parameter count (DeepSpeed's TestZero3ParamPartitioningManyParams, 100 parameters: over 300 s)."""
    for rank, graphs in enumerate(two_rank_results(tmp_path, MANY_PARAMS_STEP)):
        updates = [instructions for computes_update, instructions in graphs if computes_update]
        assert len(updates) == 1, (
            f"rank {rank}: {len(updates)} graphs of one steady ZeRO-3 step of 16 parameters compute the updated "
            f"partition (HLO instructions: {updates}); one was expected, before the persistent parameters are gathered")


def test_a_cut_writes_out_only_the_gradient_views_still_pending():
    """Before each cut in the backward pass the gradient views of a bucket written since are brought up to date.
    A view already written out stays a buffer while stale (PyTorch/XLA recomputes it from the bucket when read):
    brought up to date it became an output of the cut again, at every later cut, so a ZeRO-3 backward pass through
    the host bridge wrote out every earlier gradient once per parameter."""
    bucket = torch.zeros(8, device=XLA)
    written, new = torch.nn.Parameter(torch.zeros(4, device=XLA)), torch.nn.Parameter(torch.zeros(4, device=XLA))
    written.grad = bucket.narrow(0, 0, 4)
    engine = types.SimpleNamespace(optimizer=types.SimpleNamespace(), module=torch.nn.ParameterList([written, new]))
    runtime.sync()
    bucket.narrow(0, 4, 4).copy_(torch.ones(4, device=XLA))
    new.grad = bucket.narrow(0, 4, 4)
    step_graphs._refresh_gradient_views(engine)
    assert (runtime.is_pending(written.grad), runtime.is_pending(new.grad)) == (False, True), (
        "after the refresh, the gradient view written out at the last cut is a pending value again (or the new one "
        "is not): the next cut writes it out once more")
    runtime.sync()
    assert (written.grad.cpu().tolist(), new.grad.cpu().tolist()) == ([0.0] * 4, [1.0] * 4)


# A child script's steady ZeRO-{stage} training: a two-layer MLP's engine, its step(), three steps done.
STEADY_ZERO_STEPS = EXECUTED_HLO + textwrap.dedent("""
    import json, re, torch, deepspeed

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 8))
    # ZeRO-3 partitions every parameter (by default it keeps ones this small whole on each rank)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config={{
        "train_micro_batch_size_per_gpu": 4, "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
        "zero_optimization": {{"stage": {stage}, "stage3_param_persistence_threshold": 0}}}})
    x = torch.randn(4, 24).to(engine.device)

    def step():
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        loss.item()

    for _ in range(3):
        step()
""")

STEP_GRAPH_OUTPUTS = STEADY_ZERO_STEPS + textwrap.dedent("""
    # the graphs two steady steps execute: the outputs of each
    hlo = executed_hlo(lambda: (step(), step()))
    graphs = re.findall(r"entry_computation_layout=\\{{\\((.*?)\\)->\\((.*?)\\)\\}}", hlo)
    print(json.dumps({{"graph_outputs": [outputs for _, outputs in graphs]}}))
""")

# stage: (graphs per step, what a weight matrix of the model looks like as a graph output: whole under ZeRO-1/2,
# this rank's flat partition under ZeRO-3)
STEP_GRAPHS = {1: (2, r"f32\[(?:40,24|8,40)\]"), 2: (2, r"f32\[(?:40,24|8,40)\]"), 3: (3, r"f32\[(?:960|320)\]")}


@pytest.mark.parametrize("stage", STEP_GRAPHS)
def test_zero_parameters_are_written_out_with_their_flat_buffer_only(tmp_path, stage):
    """ZeRO keeps each parameter (ZeRO-3: each partition) as a view into one flat buffer, which the step
    updates in place. DeepSpeed ends each step by pointing every parameter at a new view of that buffer;
    on XLA each new view was a graph output of its own, a second copy of every parameter written per step."""
    run = run_python(STEP_GRAPH_OUTPUTS.format(stage=stage), "xla",
                     {**single_rank_env(), "GRAPHS_OUT": str(tmp_path / "graphs")})
    graphs = last_json(run)["graph_outputs"]
    per_step, weight = STEP_GRAPHS[stage]
    assert len(graphs) == 2 * per_step, f"two ZeRO-{stage} steps ran {len(graphs)} graphs, expected {per_step} each"
    step_graph_outputs = graphs[-1]  # the graph that ends a step: the optimizer's
    weights = re.findall(weight, step_graph_outputs)
    assert not weights, (f"ZeRO-{stage}: the graph ending a step writes {len(weights)} weight matrices out on their own "
                         f"({step_graph_outputs}); they are views of the flat parameter buffer it already writes")


GRADIENT_PARTITION_READS = STEADY_ZERO_STEPS.format(stage=2) + textwrap.dedent("""
    # where the graph ending a steady step reads each gradient out of the flat gradient partition
    step_graph = executed_hlo(step).split("HloModule ")[-1]
    numel = sum(p.numel() for p in net.parameters())
    reads = re.findall(r"slice\\(f32\\[" + str(numel) + r"\\]\\S* %\\S+\\), slice=.\\[(\\d+):(\\d+)\\]", step_graph)
    print(json.dumps({"reads": sorted([int(a), int(b)] for a, b in reads),
                      "numels": [p.numel() for p in net.parameters()]}))
""")


def test_zero2_step_reads_the_gradient_partition_in_parameter_order(tmp_path):
    """ZeRO-2 copies each reduced gradient into one flat partition buffer as the backward pass reduces it
    (last layer first), and the step reads the gradients back in parameter order: on XLA a reordering
    pass over the whole partition in the step's graph, unless each gradient lies at its parameter's
    offset (zero_buffers.py)."""
    result = last_json(run_python(GRADIENT_PARTITION_READS, "xla", {**single_rank_env(), "GRAPHS_OUT": str(tmp_path / "graphs")}))
    offsets = [0]
    for numel in result["numels"]:
        offsets.append(offsets[-1] + numel)
    in_parameter_order = [[start, end] for start, end in zip(offsets, offsets[1:])]
    assert result["reads"] == in_parameter_order, (
        f"the ZeRO-2 step reads its gradients at {result['reads']} of the flat partition; in parameter order they "
        f"lie at {in_parameter_order}, which the step reads as the buffer it is")


# A child script's three steps of one of the optimizer kernels DeepSpeed loads on XLA ($KERNEL) on fp32 buffers of 12,345
# elements: per graph XLA compiled, the copies of such a buffer it makes.
OPTIMIZER_BUFFER_COPIES = OPTIMIZED_HLO + textwrap.dedent("""
    import json, re, torch, torch_xla
    from deepspeed.ops.op_builder import FusedAdamBuilder, FusedLambBuilder, FusedLionBuilder

    device = torch_xla.device()
    generator = torch.Generator().manual_seed(0)
    grad, param, exp_avg, exp_avg_sq = (torch.randn(12345, generator=generator).to(device) for _ in range(4))
    kernels = {
        "adam": lambda step, grad: FusedAdamBuilder().load().multi_tensor_adam(
            2048, None, [[grad], [param], [exp_avg], [exp_avg_sq]], 1e-3, 0.9, 0.999, 1e-8, step, 1, True, 0.01),
        "lion": lambda step, grad: FusedLionBuilder().load().multi_tensor_lion(
            2048, None, [[grad], [param], [exp_avg]], 1e-3, 0.9, 0.99, step, 0.01),
        "lamb": lambda step, grad: FusedLambBuilder().load().lamb(
            param, torch.empty(0, device=device), exp_avg, exp_avg_sq, grad, 1e-3, 0.9, 0.999, 10.0, 0.01, 1e-8, 1.0,
            step, 0, True, 0.01),
    }
    for step in range(1, 4):
        kernels[os.environ["KERNEL"]](step, grad * step)
        torch_xla.sync()
    copies = [len(re.findall(r"= f32\\[12345\\]\\{0\\} copy\\(", text)) for text in optimized_hlo()]
    print(json.dumps({"copies": copies}))
""")


# Per kernel, the copies of a buffer each step's graph cannot do without: Lion's parameter update reads the momentum
# as it was before the step, after the momentum's update has overwritten that buffer.
NEEDED_BUFFER_COPIES = {"adam": 0, "lion": 1, "lamb": 0}


@pytest.mark.parametrize("kernel", NEEDED_BUFFER_COPIES)
def test_optimizer_kernels_update_their_buffers_in_place(tmp_path, kernel):
    """The step's graph may write each updated buffer (the parameter, the moments) into the buffer it
    read, which PyTorch/XLA donates. Written back with `copy_`, torch_xla 2.9 paired the parameter's new
    value with a moment's buffer, and XLA copied the buffers in every step (3-4 copies per step here; the
    Adam step of a ZeRO-1 fp32 model: 2 copies of the 16 MB partition, 1.15x -> 1.10x the hand loop)."""
    run = run_python(OPTIMIZER_BUFFER_COPIES, "xla", {"KERNEL": kernel, "GRAPHS_OUT": str(tmp_path / "graphs")})
    copies = last_json(run)["copies"]
    needed = NEEDED_BUFFER_COPIES[kernel]
    assert copies and all(count == needed for count in copies), (
        f"{kernel}: the graphs of three optimizer steps copy a whole buffer {copies} times (per graph), where "
        f"{needed} is needed; each update is written into the buffer it replaces")


def test_the_host_bridge_asks_the_step_policy_before_it_reads_operands():
    """The bridge's cut before a collective's read (comm.set_before_operands_read) is wired once DeepSpeed's engine
    loads. No two-rank graph test here fails without it (the reductions cut before the bridge reads), so its wiring
    is checked directly."""
    code = ("import json, deepspeed\n"
            "from deepspeed_xla import comm\n"
            "from deepspeed_xla.patches import step_graphs\n"
            "print(json.dumps(comm._before_operands_read is step_graphs.cut_before_collective_read))")
    assert last_json(run_python(code, "xla")) is True
