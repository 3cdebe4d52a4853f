"""DeepSpeed's quantizer kernels for ZeRO++ as torch ops: what `QuantizerBuilder().load()` returns on XLA.

ZeRO++ loads the CUDA module `quantizer` for quantized weights (`zero_quantized_weights`,
`CUDAQuantizer`: `quantize` and `dequantize` around ZeRO-3's parameter all-gather) and quantized
gradients (`zero_quantized_gradients`, `all_to_all_quant_reduce` across nodes: `swizzle_quant`,
`quantized_reduction`, `dequantize`). These functions take and return what the CUDA kernels take and
return, in the kernels' layout and with their arithmetic:

- groups: a tensor of N elements quantized in G groups is G consecutive runs of N/G elements, each with
  its own parameters (float32, shape [G, 1]: 1/scale; asymmetric [G, 2]: 1/scale, offset).
- symmetric: scale = 2^bits / (2 * max|x|) (1 where the group is all zero); q = round(x * scale),
  rounding half to even, clamped to [-2^(bits-1), 2^(bits-1) - 1]; x' = q / scale.
- asymmetric: scale = 2^bits / (max - min) (1 where max == min), offset = (max + min) / 2;
  q = round((x - offset) * scale), clamped the same way; x' = q / scale + offset.
- 4 bits: two values a byte, the first in the high nibble (the CUDA kernels' `PackedInt4`), so the
  last dimension of a quantized tensor is half the input's.

Arithmetic is in float32 whatever the input dtype (the CUDA kernels read fp16, which `CUDAQuantizer`
converts to). Where the results differ from the CUDA kernels':
- `quantized_reduction` sums in float32, the kernel in fp16 (rounding each term, and able to overflow), so a
  sum's scale can differ by a few ulps;
- an asymmetric group's range is its own values' (the kernels count the zeros that pad a group which does
  not fill its threads, so a group of positive values gets min 0 there); ZeRO++ quantizes symmetrically;
- a NaN makes its group's scale NaN (the kernels' max skips it);
- asymmetric dequantization multiplies and adds with two roundings (the kernel's FMA one: 1 ulp).
Only the kernels ZeRO++ calls are here: the CUDA module's in-place fake quantizers (`ds_quantize_*`, MoQ's and
the compression library's) and LoCo's error-feedback kernels (`loco_*`) serve features DeepSpeed has removed, and
raise NotImplementedError saying so.
"""

import enum

import torch


class QuantizationType(enum.IntEnum):
    """The CUDA module's `QuantizationType`, with its values (`quantize::Type`)."""
    Symmetric = 0
    Asymmetric = 1


Symmetric = QuantizationType.Symmetric
Asymmetric = QuantizationType.Asymmetric


def _params(groups, num_bits, quant_type):
    # groups: float32 [G, n] -> (scale [G, 1], offset [G, 1] or None)
    levels = float(1 << num_bits)
    if QuantizationType(quant_type) == Symmetric:
        absmax = groups.abs().amax(dim=-1, keepdim=True)
        return torch.where(absmax == 0, 1.0, levels / (2 * absmax)), None
    high = groups.amax(dim=-1, keepdim=True)
    low = groups.amin(dim=-1, keepdim=True)
    return torch.where(high == low, 1.0, levels / (high - low)), (high + low) / 2


def _stored(scale, offset):
    # What the kernels store per group: 1/scale, then the offset where there is one.
    inverse = 1.0 / scale
    return inverse if offset is None else torch.cat((inverse, offset), dim=-1)


def _to_int(groups, scale, offset, num_bits):
    # float32 [G, n] -> int8 [G, n] codes (not yet packed)
    shifted = groups if offset is None else groups - offset
    limit = 1 << (num_bits - 1)
    return torch.round(shifted * scale).clamp(-limit, limit - 1).to(torch.int8)


def _pack(codes, num_bits):
    # int8 codes [..., 2k] in [-8, 7] -> int8 [..., k] with the first of each pair in the high nibble.
    if num_bits == 8:
        return codes
    pairs = codes.to(torch.int32).unflatten(-1, (-1, 2))
    return (pairs[..., 0] * 16 + torch.remainder(pairs[..., 1], 16)).to(torch.int8)


def _unpack(data, num_bits):
    # The inverse of _pack, as float32 codes: int8 [..., k] -> [..., 2k] for 4 bits.
    if num_bits == 8:
        return data.to(torch.float32)
    byte = data.to(torch.int32)
    high = torch.div(byte, 16, rounding_mode="floor")
    low = byte - 16 * high
    low = torch.where(low >= 8, low - 16, low)
    return torch.stack((high, low), dim=-1).flatten(-2).to(torch.float32)


def _check_bits(num_bits):
    if num_bits not in (4, 8):
        raise ValueError(f"the quantizer kernels take 4 or 8 bits, got num_bits={num_bits}")


def _quantize_groups(values, num_groups, num_bits, quant_type):
    # values: any float tensor -> (packed int8 [G, n / (8 / bits)], params float32 [G, 1 | 2])
    _check_bits(num_bits)
    groups = values.reshape(num_groups, -1).to(torch.float32)
    scale, offset = _params(groups, num_bits, quant_type)
    return _pack(_to_int(groups, scale, offset, num_bits), num_bits), _stored(scale, offset)


def _dequantize_groups(data, params, num_groups, num_bits, quant_type):
    # packed int8 (any shape) + params [G, 1 | 2] -> float32 [G, n]
    _check_bits(num_bits)
    codes = _unpack(data.reshape(num_groups, -1), num_bits)
    params = params.reshape(num_groups, -1).to(torch.float32)
    values = codes * params[:, :1]
    if QuantizationType(quant_type) == Asymmetric:
        values = values + params[:, 1:2]
    return values


def _packed_shape(shape, num_bits, packing):
    # The last dimension of a tensor after packing (packing=True) or unpacking (False) 4-bit values.
    sizes = list(shape)
    if num_bits == 4:
        sizes[-1] = sizes[-1] // 2 if packing else sizes[-1] * 2
    return sizes


@torch.no_grad()
def quantize(input_vals, groups, num_bits, quant_type):
    """Quantize `input_vals` (any float dtype, N elements) in `groups` groups of N / groups elements.

    Returns (int8 tensor of input_vals' shape, last dimension halved for 4 bits; float32 params
    [groups, 1] for Symmetric, [groups, 2] for Asymmetric). Raises ValueError for num_bits not 4 or 8.
    """
    data, params = _quantize_groups(input_vals, groups, num_bits, quant_type)
    return [data.reshape(_packed_shape(input_vals.shape, num_bits, packing=True)), params]


@torch.no_grad()
def dequantize(quantized_data, params, groups, num_bits, quant_type):
    """The fp16 values of `quantize`'s output: shape of `quantized_data`, last dimension doubled for 4 bits."""
    return _dequantize(quantized_data, params, groups, num_bits, quant_type).to(torch.float16)


@torch.no_grad()
def dequantize_fp32(quantized_data, params, groups, num_bits, quant_type):
    """`dequantize` with a float32 result."""
    return _dequantize(quantized_data, params, groups, num_bits, quant_type)


def _dequantize(quantized_data, params, groups, num_bits, quant_type):
    values = _dequantize_groups(quantized_data, params, groups, num_bits, quant_type)
    return values.reshape(_packed_shape(quantized_data.shape, num_bits, packing=False))


@torch.no_grad()
def swizzle_quant(input_vals, groups, num_bits, quant_type, pipeline_size, nodes, devices_per_node):
    """Quantize `input_vals` in `groups` groups and reorder them for ZeRO++'s two all-to-alls.

    The groups form nodes * devices_per_node partitions (partition p = node * devices_per_node + device),
    each cut into `pipeline_size` slices. The output holds slice by slice, for each device, for each
    node, that partition's groups: partition (node, device) moves to position device * nodes + node.
    Returns (flat int8 [N / (8 / bits)], float32 params [groups, 1 | 2]) in that order.
    Raises ValueError where groups is not a multiple of nodes * devices_per_node * pipeline_size.
    """
    partitions = nodes * devices_per_node
    if groups % (partitions * pipeline_size):
        raise ValueError(f"swizzle_quant: {groups} groups do not split into {partitions} partitions of "
                         f"{pipeline_size} slices")
    data, params = _quantize_groups(input_vals, groups, num_bits, quant_type)
    layout = (nodes, devices_per_node, pipeline_size, groups // (partitions * pipeline_size))

    def swizzled(per_group):
        return per_group.reshape(*layout, -1).permute(2, 1, 0, 3, 4).reshape(groups, -1)

    return [swizzled(data).flatten(), swizzled(params)]


@torch.no_grad()
def quantized_reduction(input_vals, input_scales, in_groups, out_groups, num_bits, quant_type, devices_per_node):
    """Sum the `devices_per_node` quantized tensors laid end to end in `input_vals`, and quantize the sum.

    input_vals: int8, devices_per_node equal tensors of in_groups / devices_per_node groups each, with
    their params `input_scales` ([in_groups, 1 | 2], in the same order). The sum (float32) is
    quantized in `out_groups` groups. Returns (int8 of input_vals' shape with its last dimension divided
    by devices_per_node, float32 params [out_groups, 1 | 2]).
    """
    values = _dequantize_groups(input_vals, input_scales, in_groups, num_bits, quant_type)
    total = values.reshape(devices_per_node, -1).sum(dim=0)
    data, params = _quantize_groups(total, out_groups, num_bits, quant_type)
    shape = list(input_vals.shape)
    shape[-1] //= devices_per_node
    return [data.reshape(shape), params]


# Other functions of the CUDA module serve features DeepSpeed 0.19.8 has removed (MoQ and the compression library's
# fake quantization, ZeRO++ LoCo) or experimental dequantizers nothing in DeepSpeed calls.
_NOT_HERE = ("ds_quantize", "ds_sr_quantize", "loco_", "dequantize_int")


def __getattr__(name):
    if name.startswith(_NOT_HERE):
        raise NotImplementedError(
            f"DeepSpeed's quantizer kernel '{name}' has no XLA implementation: deepspeed_xla provides the kernels "
            "ZeRO++ calls (quantize, dequantize, dequantize_fp32, swizzle_quant, quantized_reduction); MoQ, the "
            "compression library and LoCo, which used the others, are gone from DeepSpeed.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
