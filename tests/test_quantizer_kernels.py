"""ZeRO++'s quantizer kernels as torch ops (deepspeed_xla/op_builder/quantizer.py), against a reference written
element by element from the CUDA kernels' definitions (csrc/quantization: quantize, swizzled_quantize,
quant_reduce), on host tensors; then the same results on an XLA device, bit for bit."""

import textwrap

import pytest
import torch

from helpers import last_json, run_python
from deepspeed_xla.op_builder import quantizer as kernels
from deepspeed_xla.op_builder import get_builder_class

SYM, ASYM = kernels.Symmetric, kernels.Asymmetric


def _reference_quantize(values, num_groups, num_bits, symmetric):
    """(codes as a list of ints, one list of params per group), one element at a time with Python floats."""
    flat = [float(v) for v in values.flatten().tolist()]
    size = len(flat) // num_groups
    levels, limit = 2**num_bits, 2**(num_bits - 1)
    codes, params = [], []
    for g in range(num_groups):
        group = flat[g * size:(g + 1) * size]
        if symmetric:
            absmax = max(abs(v) for v in group)
            scale, offset = (1.0 if absmax == 0 else levels / (2 * absmax)), 0.0
        else:
            high, low = max(group), min(group)
            scale, offset = (1.0 if high == low else levels / (high - low)), (high + low) / 2
        scale = float(torch.tensor(scale, dtype=torch.float32))  # the kernels keep the scale in float32
        codes += [min(max(round((v - offset) * scale), -limit), limit - 1) for v in group]  # round: half to even
        params.append([1 / scale] if symmetric else [1 / scale, offset])
    return codes, params


def _reference_pack(codes, num_bits):
    """int8 bytes as ints: 8 bits as they are; 4 bits two a byte, the first in the high nibble."""
    if num_bits == 8:
        return codes
    packed = []
    for first, second in zip(codes[0::2], codes[1::2]):
        byte = ((first & 0xF) << 4) | (second & 0xF)
        packed.append(byte - 256 if byte > 127 else byte)
    return packed


def _values(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("num_bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "asymmetric"])
@pytest.mark.parametrize("num_groups", [1, 3])
def test_quantize_matches_the_kernel_definition(num_bits, symmetric, num_groups):
    values = _values((3, 16), seed=num_groups * 10 + num_bits)
    values[0, :4] = 0.0  # zeros inside a group
    data, params = kernels.quantize(values, num_groups, num_bits, SYM if symmetric else ASYM)
    codes, want_params = _reference_quantize(values, num_groups, num_bits, symmetric)
    assert data.dtype == torch.int8 and tuple(data.shape) == (3, 16 if num_bits == 8 else 8)
    assert data.flatten().tolist() == _reference_pack(codes, num_bits), "quantized bytes differ from the reference"
    assert params.dtype == torch.float32 and tuple(params.shape) == (num_groups, 1 if symmetric else 2)
    torch.testing.assert_close(params, torch.tensor(want_params), rtol=1e-6, atol=0)


def test_an_all_zero_group_has_scale_one_and_zero_codes():
    data, params = kernels.quantize(torch.zeros(2, 8), 2, 8, SYM)
    assert data.eq(0).all() and params.eq(1.0).all()


@pytest.mark.parametrize("num_bits", [4, 8])
@pytest.mark.parametrize("quant_type", [SYM, ASYM], ids=["symmetric", "asymmetric"])
def test_dequantize_is_codes_times_the_stored_scale(num_bits, quant_type):
    values = _values((4, 32), seed=num_bits)
    data, params = kernels.quantize(values, 4, num_bits, quant_type)
    codes, _ = _reference_quantize(values, 4, num_bits, quant_type == SYM)
    want = torch.tensor(codes, dtype=torch.float32).reshape(4, -1) * params[:, :1]
    if quant_type == ASYM:
        want = want + params[:, 1:]
    out16 = kernels.dequantize(data, params, 4, num_bits, quant_type)
    out32 = kernels.dequantize_fp32(data, params, 4, num_bits, quant_type)
    assert out16.dtype == torch.float16 and out32.dtype == torch.float32 and tuple(out32.shape) == (4, 32)
    torch.testing.assert_close(out32, want.reshape(4, 32), rtol=0, atol=0)
    torch.testing.assert_close(out16, want.reshape(4, 32).half(), rtol=0, atol=0)
    # every value within one quantization step (the clamped extreme is a whole step off)
    assert ((out32 - values).abs() <= params[:, :1] * 1.0001).all()  # a group is a row here


@pytest.mark.parametrize("num_bits", [4, 8])
@pytest.mark.parametrize("nodes, devices_per_node, pipeline_size", [(2, 4, 1), (3, 2, 2), (1, 2, 1)])
def test_swizzle_quant_orders_groups_as_the_kernel_indexes_them(num_bits, nodes, devices_per_node, pipeline_size):
    partitions = nodes * devices_per_node
    contiguous = 2
    groups = partitions * pipeline_size * contiguous
    values = _values((groups, 8), seed=groups)
    data, params = kernels.swizzle_quant(values, groups, num_bits, SYM, pipeline_size, nodes, devices_per_node)
    plain, plain_params = kernels.quantize(values, groups, num_bits, SYM)
    plain = plain.reshape(groups, -1)
    want_data = [None] * groups
    want_params = [None] * groups
    # the kernel's indexing: input block (x, y, z) -> output block rank, as in swizzled_quant_kernel
    for z in range(partitions):
        for y in range(pipeline_size):
            for x in range(contiguous):
                block = x + y * contiguous + z * contiguous * pipeline_size
                out_partition = y * partitions + (z % devices_per_node) * nodes + z // devices_per_node
                out_block = out_partition * contiguous + x
                want_data[out_block], want_params[out_block] = plain[block], plain_params[block]
    assert data.dim() == 1 and torch.equal(data, torch.cat(want_data)), "swizzled bytes out of the kernel's order"
    assert torch.equal(params, torch.stack(want_params)), "swizzled scales out of the kernel's order"


def test_swizzle_quant_refuses_groups_that_do_not_split_into_partitions():
    with pytest.raises(ValueError, match="6 groups do not split into 4 partitions"):
        kernels.swizzle_quant(torch.ones(6, 8), 6, 8, SYM, 1, 2, 2)


def _all_to_all(buffers):
    """all_to_all_single among len(buffers) ranks: rank i's j-th equal chunk goes to rank j, in rank order."""
    size = len(buffers)
    return [torch.cat([buffers[source].chunk(size)[target] for source in range(size)]) for target in range(size)]


@pytest.mark.parametrize("nodes, devices_per_node", [(2, 2), (2, 4), (3, 2)])
def test_quantized_gradients_round_trip_gives_each_rank_its_partition(nodes, devices_per_node):
    """DeepSpeed's all_to_all_quant_reduce, with its collectives done by hand among nodes * devices_per_node ranks:
    rank (node n, device d) must end with partition n * devices_per_node + d of the ranks' sum divided by nodes.
    Values are k/8 * c (k in -8..7, each group starting at -c), so 4-bit quantization is exact at every stage,
    and each rank's c is a distinct power of two, so a sum that took a wrong rank's data shows."""
    world = nodes * devices_per_node
    rows, cols = 4 * world, 8
    groups = max(rows, cols, world)
    pattern = torch.randint(-8, 8, (rows * cols, ), generator=torch.Generator().manual_seed(world)).float() / 8
    pattern.view(groups, -1)[:, 0] = -1.0
    pattern = pattern.reshape(rows, cols)
    coefficient = [2.0**rank for rank in range(world)]
    inputs = [(pattern * c).half() for c in coefficient]

    swizzled = [kernels.swizzle_quant(t, groups, 4, SYM, 1, nodes, devices_per_node) for t in inputs]
    reduced = {}
    for node in range(nodes):
        local = range(node * devices_per_node, (node + 1) * devices_per_node)
        data = _all_to_all([swizzled[r][0] for r in local])
        scales = _all_to_all([swizzled[r][1] for r in local])
        for index, rank in enumerate(local):
            reduced[rank] = kernels.quantized_reduction(data[index], scales[index], groups, groups // devices_per_node,
                                                        4, SYM, devices_per_node)
    for device in range(devices_per_node):
        peers = range(device, world, devices_per_node)
        data = _all_to_all([reduced[r][0] for r in peers])
        scales = _all_to_all([reduced[r][1] for r in peers])
        for index, rank in enumerate(peers):
            final = kernels.dequantize(data[index], scales[index], scales[index].numel(), 4, SYM)
            output = (sum(final.chunk(nodes)) / nodes).view(-1)
            partition = pattern.flatten().chunk(world)[rank]
            torch.testing.assert_close(output, (partition * sum(coefficient)).half() / nodes, rtol=0, atol=0,
                                       msg=f"rank {rank}: not its partition of the sum")


def test_kernels_of_features_deepspeed_removed_say_so():
    for name, error, message in (
            ("loco_swizzle_quant", NotImplementedError, "'loco_swizzle_quant' has no XLA implementation.*LoCo.*gone"),
            ("ds_quantize_fp16", NotImplementedError, "'ds_quantize_fp16' has no XLA implementation.*MoQ"),
            ("no_such_kernel", AttributeError, "no attribute 'no_such_kernel'")):
        with pytest.raises(error, match=message):
            getattr(kernels, name)


def test_deepspeed_loads_the_quantizer_and_it_runs_on_an_xla_device():
    """What ZeRO++ loads (deepspeed.ops.op_builder.QuantizerBuilder under DS_ACCELERATOR=xla), run on the XLA
    device: the same bytes, params and values as on the host."""
    code = textwrap.dedent("""
        import json
        import torch
        import torch_xla
        import deepspeed
        from deepspeed.ops.op_builder import QuantizerBuilder
        module = QuantizerBuilder().load()
        values = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)).half()
        out = {}
        for where in ("cpu", torch_xla.device()):
            data, params = module.swizzle_quant(values.to(where), 64, 4, module.Symmetric, 1, 2, 2)
            reduced, scales = module.quantized_reduction(data, params, 64, 32, 4, module.Symmetric, 2)
            q8, p8 = module.quantize(values.to(where), 16, 8, module.Asymmetric)
            back = module.dequantize(q8, p8, 16, 8, module.Asymmetric)
            out[str(where)[:3]] = [t.cpu().float().flatten().tolist() for t in (data, params, reduced, scales, back)]
        print(json.dumps({"compatible": deepspeed.ops.__compatible_ops__["quantizer"],
                          "equal": out["cpu"] == out["xla"]}))
    """)
    result = last_json(run_python(code, "xla"))
    assert result["compatible"] is True, "DeepSpeed does not list the quantizer as compatible under XLA"
    assert result["equal"], "the quantizer kernels give other results on the XLA device than on the host"


def test_the_builder_is_the_torch_native_one():
    builder = get_builder_class("QuantizerBuilder")()
    assert builder.NAME == "quantizer" and builder.is_compatible() and builder.load() is kernels
