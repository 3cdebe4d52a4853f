"""Behaviour specific to deepspeed_xla's implementation, on a real PJRT CPU device.

The accelerator interface itself (every DeepSpeed method, for any candidate) is checked
by the conformance suite; these tests pin down the choices this package makes: how
DeepSpeed's device indices map to the process's device, how RNG state is encoded,
which kernels the op-builder rule hands out, and the torch_xla corrections it installs (batch
normalization's running variance among them).
"""

import gc
import math
import re
import weakref

import pytest
import torch
import torch_xla
import torch_xla.utils.dlpack

from deepspeed_xla.accelerator import XLA_Accelerator
from deepspeed_xla.backend import runtime
from deepspeed_xla.op_builder import NotAvailableOnXlaBuilder, get_builder_class
from deepspeed_xla.op_builder.torch_native import multi_tensor_adam, multi_tensor_lion
from deepspeed_xla.rng import seeds_to_state, state_to_seeds
from xla_host import discovery

XLA = torch_xla.device()


@pytest.fixture(scope="module")
def accel():
    return XLA_Accelerator()


@pytest.mark.parametrize("index", [0, "0", "xla:0", torch.device("xla", 0)], ids=repr)
def test_device_name_accepts_every_index_form(accel, index):
    assert accel.device_name(index) == "xla:0", f"device_name({index!r}) should name xla:0"


def test_local_rank_maps_to_this_process_device(accel, monkeypatch):
    # A rank started by DeepSpeed's launcher owns one device, which it sees as xla:0.
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert accel.device_name(3) == "xla:0", "local rank 3's own device must be xla:0 in its process"
    assert accel.device_name("3") == "xla:0", "LOCAL_RANK arrives as a string; it must map the same way"
    accel.set_device("3")
    assert accel.current_device() == 0 and accel.current_device_name() == "xla:0"


@pytest.mark.parametrize("bad", [-1, "gpu", "xla:x", 1.5, torch.device("cpu"), True], ids=repr)
def test_bad_device_index_is_a_clear_error(accel, bad):
    with pytest.raises(ValueError, match="XLA device|device index"):
        accel.device_name(bad)


@pytest.mark.parametrize("env,expected", [({}, 1), ({"DS_XLA_CPU_DEVICES": "4"}, 4),
                                          ({"LOCAL_WORLD_SIZE": "2", "DS_XLA_CPU_DEVICES": "4"}, 2)],
                         ids=["default", "configured", "launched"])
def test_cpu_device_count_rule(monkeypatch, env, expected):
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "DS_XLA_CPU_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert discovery.local_device_count() == expected, f"PJRT CPU device count with {env}"


@pytest.mark.parametrize("seed", [0, 1, 2**63 + 12345, 2**64 - 1])
def test_rng_state_encoding_round_trips(seed):
    state = seeds_to_state(7, seed)
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert state_to_seeds(state) == (7, seed)
    running_only = torch.tensor(list(seed.to_bytes(8, "little")), dtype=torch.uint8)  # earlier versions' state
    assert state_to_seeds(running_only) == (seed, seed), "an 8-byte state (running seed alone) restores both"


def test_rng_state_rejects_foreign_state():
    with pytest.raises(ValueError, match="uint8 tensor of 16 bytes"):
        state_to_seeds(torch.get_rng_state())  # the CPU generator's 5056-byte state


def _after_sync_draws(accel, restore):
    """Draws of the step after one whose middle ran `restore` (a get/set round trip, or nothing)."""
    accel.manual_seed(5)
    torch.rand(3, device=XLA)
    restore()
    torch_xla.sync()
    return torch.rand(3, device=XLA).cpu()


def test_restoring_mid_step_keeps_the_next_steps_random_stream(accel):
    # Activation checkpointing restores RNG states in the middle of a step; torch_xla's setter also
    # resets the step's base seed, from which the next step's seeds come.
    plain = _after_sync_draws(accel, lambda: None)
    round_trip = _after_sync_draws(accel, lambda: accel.set_rng_state(accel.get_rng_state()))
    assert torch.equal(plain, round_trip), "a mid-step get/set round trip changed the next step's draws"


def test_next_step_seed_is_torch_xlas_rule():
    runtime.set_rng_seed(5, XLA)
    torch_xla.sync()
    assert runtime.get_rng_seed(XLA) == runtime.next_step_seed(5) == runtime.get_rng_base_seed(XLA)


def test_manual_seed_reaches_the_xla_generator(accel):
    accel.manual_seed(1234)
    first = torch.rand(5, device=XLA).cpu()
    accel.manual_seed(1234)
    again = torch.rand(5, device=XLA).cpu()
    assert torch.equal(first, again), "manual_seed must make XLA draws reproducible (torch.manual_seed alone does not)"


def test_tensor_types_build_on_the_xla_device(accel):
    t = accel.FloatTensor([1.0, 2.0])
    assert t.device.type == "xla" and t.dtype == torch.float32
    assert accel.IntTensor(3).shape == (3, ) and accel.IntTensor(3).dtype == torch.int32
    assert isinstance(t, accel.FloatTensor) and not isinstance(t.cpu(), accel.FloatTensor)
    assert accel.ByteTensor([1]).dtype == torch.uint8 and accel.BFloat16Tensor([1.0]).dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["FusedAdamBuilder", "FusedLambBuilder", "FusedLionBuilder"])
def test_device_optimizer_kernels_are_torch_native(name):
    builder = get_builder_class(name)()
    assert builder.is_compatible(), f"{name} must be usable on XLA"
    kernel = {"FusedAdamBuilder": "multi_tensor_adam", "FusedLambBuilder": "lamb", "FusedLionBuilder": "multi_tensor_lion"}[name]
    assert callable(getattr(builder.load(), kernel, None)), f"{name}().load() lacks the {kernel} kernel"


@pytest.mark.parametrize("name", ["CPUAdamBuilder", "AsyncIOBuilder"])
def test_host_kernels_come_from_deepspeed_cpu_builders(name):
    from deepspeed.ops.op_builder import cpu
    assert get_builder_class(name) is getattr(cpu, name), f"{name} must be DeepSpeed's own CPU builder"


def test_cuda_only_kernels_are_refused_by_name():
    # DeepSpeed's InferenceBuilder: the op DeepSpeed calls "transformer_inference" keeps that name
    builder = get_builder_class("InferenceBuilder")()
    assert isinstance(builder, NotAvailableOnXlaBuilder) and not builder.is_compatible()
    assert builder.NAME == "transformer_inference"
    with pytest.raises(RuntimeError, match="transformer_inference.*no XLA implementation"):
        builder.load()


def _params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(17, 5, generator=g, dtype=torch.float32).to(dtype), torch.randn(9, generator=g).to(dtype)]


@pytest.mark.parametrize("adam_w_mode,weight_decay", [(1, 0.1), (0, 0.1), (1, 0.0)], ids=["adamw", "adam-l2", "nodecay"])
def test_multi_tensor_adam_matches_torch_adam(adam_w_mode, weight_decay):
    reference = [p.clone().requires_grad_() for p in _params(torch.float32)]
    optimizer_class = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    optimizer = optimizer_class(reference, lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay)
    params = [p.to(XLA) for p in _params(torch.float32)]
    exp_avg = [torch.zeros_like(p) for p in params]
    exp_avg_sq = [torch.zeros_like(p) for p in params]
    for step in range(1, 4):
        grads = _params(torch.float32, seed=step)
        for p, g in zip(reference, grads):
            p.grad = g
        optimizer.step()
        multi_tensor_adam(2048, None, [[g.to(XLA) for g in grads], params, exp_avg, exp_avg_sq], 0.01, 0.9, 0.99,
                          1e-8, step, adam_w_mode, 1, weight_decay)
    for ours, theirs in zip(params, reference):
        torch.testing.assert_close(ours.cpu(), theirs.detach(), rtol=1e-6, atol=1e-7)


def test_multi_tensor_lion_follows_the_lion_update():
    start, grad, momentum = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, 0.2, -0.1]), torch.tensor([0.0, -1.0, 0.1])
    lr, beta1, beta2, wd = 0.1, 0.9, 0.99, 0.01
    param, xla_momentum = start.to(XLA), momentum.to(XLA)
    multi_tensor_lion(2048, None, [[grad.to(XLA)], [param], [xla_momentum]], lr, beta1, beta2, 1, wd)
    direction = torch.sign(beta1 * momentum + (1 - beta1) * grad)
    torch.testing.assert_close(param.cpu(), start * (1 - lr * wd) - lr * direction)
    torch.testing.assert_close(xla_momentum.cpu(), beta2 * momentum + (1 - beta2) * grad)


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_full_reductions_reduce_every_dimension(accel, op, dtype):
    x = torch.randn(4, 3, 2).to(dtype)
    for kwargs in ({}, {"keepdim": True}, {"dim": (0, 2)}, {"dim": -1}):
        expected = getattr(x, op)(**kwargs)
        got = getattr(x.to(XLA), op)(**kwargs).cpu()
        assert got.shape == expected.shape, f"{op}({kwargs}) on XLA has shape {tuple(got.shape)}"
        torch.testing.assert_close(got, expected)


def test_full_reduction_propagates_nan_and_inf(accel):
    # DeepSpeed's overflow check is isfinite(x.amax()) and isfinite(x.amin()).
    for bad in (math.nan, math.inf, -math.inf):
        x = torch.ones(6)
        x[4] = bad
        y = x.to(XLA)
        finite = torch.isfinite(y.amax()).logical_and(torch.isfinite(y.amin())).item()
        assert not finite, f"an element {bad} was missed by amax/amin on XLA"


SLICE_SCATTER_CASES = {
    "middle": {"dim": 0, "start": 2, "end": 5}, "head": {"dim": 0, "start": 0, "end": 3},
    "tail": {"dim": 0, "start": 4}, "whole": {"dim": 0}, "empty": {"dim": 0, "start": 3, "end": 3},
    "negative_bounds": {"dim": 0, "start": -4, "end": -1}, "past_the_end": {"dim": 0, "start": 5, "end": 99},
    "strided": {"dim": 0, "start": 1, "end": 7, "step": 2}, "last_dim": {"dim": -1, "start": 1, "end": 3},
}


@pytest.mark.parametrize("case", SLICE_SCATTER_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=["fp32", "bf16", "int64"])
def test_slice_scatter_matches_pytorch(accel, case, dtype):
    kwargs = SLICE_SCATTER_CASES[case]
    base = torch.arange(56).reshape(7, 8).to(dtype)
    view = base[:, kwargs["start"]:kwargs.get("end"):kwargs.get("step", 1)] if kwargs["dim"] == -1 else \
        base[kwargs.get("start"):kwargs.get("end"):kwargs.get("step", 1)]
    src = (-1 - torch.arange(view.numel())).reshape(view.shape).to(dtype)
    expected = torch.slice_scatter(base, src, **kwargs)
    got = torch.slice_scatter(base.to(XLA), src.to(XLA), **kwargs).cpu()
    torch.testing.assert_close(got, expected, msg=lambda m: f"slice_scatter({kwargs}) on XLA: {m}")


VIEW_WRITES = {
    "slice_of_slice": lambda x: x.view(-1)[5:][0:2].fill_(-1),
    "corner": lambda x: x[1:4, -2:].copy_(torch.full((3, 2), -1.0, device=x.device)),
    "nested_narrow": lambda x: x.view(-1).narrow(0, 4, 6).narrow(0, 1, 2).copy_(torch.full((2,), -3.0, device=x.device)),
    "transposed_slices": lambda x: x.t()[2:4][:, 1:3].fill_(-1),
    "strided_then_sliced": lambda x: x[:, ::2][:, 1:2].fill_(-1),
}


@pytest.mark.parametrize("write", VIEW_WRITES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_writes_through_views_of_views_match_pytorch(accel, write, dtype):
    # The base slice_scatter gets is then itself a view with an offset into another tensor.
    expected = torch.arange(40.0).reshape(5, 8).to(dtype)
    got = expected.to(XLA)
    VIEW_WRITES[write](expected)
    VIEW_WRITES[write](got)
    torch.testing.assert_close(got.cpu(), expected, msg=lambda m: f"{write} on XLA: {m}")


def test_a_bucket_partition_filled_in_two_copies_keeps_both(accel):
    # ZeRO's gradient partitions are narrow views of a flat buffer, filled gradient by gradient.
    expected = torch.zeros(30)
    got = expected.to(XLA)
    for flat in (expected, got):
        part = flat.narrow(0, 12, 12)
        part.narrow(0, 0, 5).copy_(torch.full((5,), -1.0).to(flat.device))
        part.narrow(0, 5, 7).copy_(torch.full((7,), -2.0).to(flat.device))
    torch.testing.assert_close(got.cpu(), expected)


def test_slice_scatter_refuses_a_source_of_the_wrong_shape(accel):
    with pytest.raises(RuntimeError, match="expected src of shape"):
        torch.slice_scatter(torch.zeros(10, device=XLA), torch.ones(3, device=XLA), 0, 0, 2)


# Host tensors made from an XLA tensor's metadata, as DeepSpeed makes its offload buffers; the values each
# call must give (None: uninitialised).
HOST_FACTORIES = {
    "empty_like": (lambda x: torch.empty_like(x, device="cpu"), None),
    "zeros_like": (lambda x: torch.zeros_like(x, device="cpu"), 0.0),
    "ones_like": (lambda x: torch.ones_like(x, device="cpu"), 1.0),
    "full_like": (lambda x: torch.full_like(x, 2.5, device="cpu"), 2.5),
    "rand_like": (lambda x: torch.rand_like(x, device="cpu"), None),
    "randint_like": (lambda x: torch.randint_like(x, 3, 4, device="cpu"), 3.0),
    "new_empty": (lambda x: x.new_empty(x.shape, device="cpu"), None),
    "new_zeros": (lambda x: x.new_zeros(x.shape, device="cpu"), 0.0),
    "new_ones": (lambda x: x.new_ones(x.shape, device="cpu"), 1.0),
    "new_full": (lambda x: x.new_full(x.shape, -1.0, device="cpu"), -1.0),
}


@pytest.mark.parametrize("factory", HOST_FACTORIES)
def test_a_host_tensor_made_from_an_xla_tensor_has_storage(accel, factory, tmp_path):
    # torch 2.9 wrapped these as functional tensors without storage: torch.save and pinning failed.
    make, fill = HOST_FACTORIES[factory]
    host = make(torch.zeros(3, 2, dtype=torch.bfloat16, device=XLA))
    assert host.device.type == "cpu" and host.shape == (3, 2) and host.dtype == torch.bfloat16
    assert not torch._is_functional_tensor(host), f"{factory} on the host is a functional wrapper"
    assert host.data_ptr() != 0, f"{factory} on the host has no storage"
    if fill is not None:
        torch.testing.assert_close(host, torch.full((3, 2), fill, dtype=torch.bfloat16))
    host.copy_(torch.arange(6.0).reshape(3, 2))
    torch.save(host, tmp_path / "host.pt")
    torch.testing.assert_close(torch.load(tmp_path / "host.pt"), host)
    torch.testing.assert_close(accel.pin_memory(host), host)


@pytest.mark.parametrize("factory", ["empty_like", "zeros_like", "new_zeros", "new_full"])
def test_a_device_tensor_made_from_an_xla_tensor_stays_functional(accel, factory):
    # In-place updates of XLA tensors depend on the functional wrapper.
    make = {"empty_like": lambda x: torch.empty_like(x), "zeros_like": lambda x: torch.zeros_like(x),
            "new_zeros": lambda x: x.new_zeros((4,)), "new_full": lambda x: x.new_full((4,), 1.0)}[factory]
    made = make(torch.ones(4, device=XLA))
    assert made.device.type == "xla" and torch._is_functional_tensor(made)
    made.fill_(1.0)
    made.view(2, 2)[1].add_(2.0)
    torch.testing.assert_close(made.cpu(), torch.tensor([1.0, 1.0, 3.0, 3.0]))


def test_functionalization_of_host_programs_is_unchanged(accel):
    def double_in_place(a):
        b = torch.zeros_like(a)
        b.add_(a).mul_(2)
        return b

    torch.testing.assert_close(torch.func.functionalize(double_in_place)(torch.ones(3)), torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_copies_into_a_bucket_lower_to_a_concatenation(accel, dtype):
    # ZeRO fills its flat gradient buckets this way; torch_xla's own lowering is a select over the
    # whole bucket per copy, which XLA does not fold across copies. In 16-bit floats the concatenation
    # must move bits: XLA's CPU compiler widens bf16/fp16 concatenations and slices to f32 before it
    # folds them, and then does not fold the chain (one pass over the bucket per copy).
    grads = [torch.randn(n).to(dtype) for n in (6, 3, 5)]
    bucket = torch.zeros(16, dtype=dtype, device=XLA)
    offset = 0
    for grad in grads:
        bucket.narrow(0, offset, grad.numel()).copy_(grad.to(XLA))
        offset += grad.numel()
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([bucket])
    assert " select(" not in hlo, f"a copy into a slice still lowers as a select:\n{hlo}"
    float_concatenations = re.findall(r"= (?:bf16|f16)\[[0-9,]*\]\{[0-9,]*\} concatenate\(", hlo)
    assert not float_concatenations, f"a copy into a {dtype} bucket concatenates floating-point values:\n{hlo}"
    torch.testing.assert_close(bucket.cpu(), torch.cat(grads + [torch.zeros(2, dtype=dtype)]))


@pytest.mark.parametrize("view", ["whole", "narrow", "column", "transposed", "pending", "scalar"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=["fp32", "bf16", "int64"])
def test_host_copies_of_xla_tensors_hold_their_values(view, dtype):
    # The host bridge moves every collective operand this way.
    base = torch.arange(24).reshape(4, 6).to(dtype)
    pick = {"whole": lambda t: t, "narrow": lambda t: t.view(-1).narrow(0, 5, 7), "column": lambda t: t[:, 2],
            "transposed": lambda t: t.t(), "pending": lambda t: t * 2 + 1, "scalar": lambda t: t.sum()}[view]
    host = runtime.to_host(pick(base.to(XLA)))
    assert host.device.type == "cpu" and host.is_contiguous()
    assert torch.equal(host, pick(base)), f"{view} {dtype}: {host} != {pick(base)}"


@pytest.mark.parametrize("view", ["whole", "column", "pending"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_host_copies_land_in_the_buffer_given(view, dtype):
    # The host bridge stages operands in buffers it reuses.
    base = torch.arange(24).reshape(4, 6).to(dtype)
    pick = {"whole": lambda t: t, "column": lambda t: t[:, 2], "pending": lambda t: t * 2 + 1}[view]
    expected = pick(base)
    out = torch.full(expected.shape, -1.0, dtype=dtype)
    host = runtime.to_host(pick(base.to(XLA)), out=out)
    assert host is out and torch.equal(out, expected), f"{view} {dtype}: {out} != {expected}"


@pytest.mark.parametrize("view", ["whole", "narrow", "column", "pending"])
def test_read_only_host_views_hold_values_without_a_copy(view):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    pick = {"whole": lambda t: t, "narrow": lambda t: t.view(-1).narrow(0, 5, 7), "column": lambda t: t[:, 2],
            "pending": lambda t: t * 2 + 1}[view]
    tensor = pick(base.to(XLA))
    host = runtime.to_host(tensor, read_only=True)
    assert host.is_contiguous() and torch.equal(host, pick(base))
    # The device buffer itself, not a copy: the bridge's operands cost no host copy on PJRT CPU.
    buffer = torch.from_dlpack(torch_xla.utils.dlpack.to_dlpack(tensor))
    assert host.data_ptr() == buffer.data_ptr()


def _python_tensor_count():
    gc.collect()
    return sum(isinstance(obj, torch.Tensor) for obj in gc.get_objects())


@pytest.mark.parametrize("layout", ["whole", "aligned slice", "unaligned slice", "column"])
def test_device_buffers_keep_no_python_object_alive(layout):
    # XLA frees device buffers on its own threads, when an asynchronous execution that used one ends. A buffer
    # that kept a Python object alive needs the GIL to be freed, and the main thread holds the GIL while it waits
    # for the device (torch_xla's exit handler does): a run that trained to the end and never exited.
    pick = {"whole": lambda t: t, "aligned slice": lambda t: t[16:48], "unaligned slice": lambda t: t[3:35],
            "column": lambda t: t.view(8, 8)[:, 2]}[layout]
    tensors_before = _python_tensor_count()
    host = pick(torch.arange(64, dtype=torch.float32))
    expected = host.tolist()
    python_object = weakref.ref(host)
    device = runtime.to_device(host, XLA)
    host.fill_(-1)  # the caller's tensor stays the caller's
    del host
    assert python_object() is None, "the device buffer keeps the host tensor's Python object alive"
    # nor one made on the way (a copy made in Python): host's objects gone, device's come
    assert _python_tensor_count() == tensors_before + 1, "the device buffer keeps a Python tensor object alive"
    assert device.cpu().tolist() == expected
    # Updated in place over steps (XLA may donate the buffer to the step's output): right values.
    for _ in range(3):
        device.mul_(2)
        runtime.sync()
    assert device.cpu().tolist() == [8.0 * v for v in expected]


def test_device_copies_do_not_alias_the_host_tensor():
    host = torch.arange(6, dtype=torch.float32)
    device = runtime.to_device(host, XLA)
    host.fill_(-1)
    assert device.device.type == "xla" and device.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    target = torch.zeros(4, 6).to(XLA)
    target[:, 2].copy_(runtime.to_device(torch.tensor([1.0, 2.0, 3.0, 4.0]), XLA))
    assert target.cpu()[:, 2].tolist() == [1.0, 2.0, 3.0, 4.0] and target.cpu().sum().item() == 10.0
    # A tensor that took over an adopted buffer and is then updated in place over several steps
    # (where XLA may donate its buffer to the step's output) keeps the right values.
    weights = torch.zeros(6).to(XLA)
    weights.copy_(runtime.to_device(torch.ones(6), XLA))
    for _ in range(3):
        weights.mul_(2)
        runtime.sync()
    assert weights.cpu().tolist() == [8.0] * 6


@pytest.mark.parametrize("eps_mode", [0, 1])
def test_lamb_matches_deepspeed_kernel_arithmetic(eps_mode):
    # The CUDA kernel's arithmetic, written out in fp64 on the host.
    from deepspeed_xla.op_builder.torch_native import lamb
    p0, g0 = torch.tensor([3.0, 4.0, -1.0], dtype=torch.float64), torch.tensor([0.5, -0.25, 2.0], dtype=torch.float64)
    m0, v0 = torch.tensor([0.1, 0.0, -0.2], dtype=torch.float64), torch.tensor([0.01, 0.02, 0.0], dtype=torch.float64)
    lr, b1, b2, eps, scale, step, decay, max_c, min_c = 0.01, 0.9, 0.999, 1e-6, 2.0, 3, 0.01, 10.0, 0.01
    g = g0 / scale
    m, v = b1 * m0 + (1 - b1) * g, b2 * v0 + (1 - b2) * g * g
    update = m / ((v + eps).sqrt() if eps_mode == 0 else v.sqrt() + eps) + decay * p0
    trust = min(max((p0.norm() / update.norm()).item(), min_c), max_c)
    step_size = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
    expected = p0 - step_size * trust * update

    param, exp_avg, exp_avg_sq = (t.float().to(XLA) for t in (p0, m0, v0))
    ratio = lamb(param, torch.tensor([]), exp_avg, exp_avg_sq, g0.float().to(XLA), lr, b1, b2, max_c, min_c, eps, scale,
                 step, eps_mode, 1, decay)
    torch.testing.assert_close(param.cpu().double(), expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(exp_avg.cpu().double(), m, rtol=1e-6, atol=1e-8)
    assert ratio.shape == (1, ) and ratio.item() == pytest.approx(trust, rel=1e-6)


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
@pytest.mark.parametrize("shape", [(8, 4), (4, 3, 5, 5)], ids=["BatchNorm1d", "BatchNorm2d"])
def test_batch_norm_running_statistics_match_pytorch(accel, shape, momentum):
    # PyTorch blends the batch's unbiased variance into running_var; torch_xla 2.9 blended the biased one.
    layer = {2: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
    torch.manual_seed(0)
    on_cpu = layer(shape[1], momentum=momentum)
    on_xla = layer(shape[1], momentum=momentum).to(XLA)
    batches = [torch.randn(shape) * 3 + 1 for _ in range(3)]
    for x in batches:
        expected, got = on_cpu(x), on_xla(x.to(XLA))
        torch.testing.assert_close(got.cpu(), expected, msg=lambda m: f"{layer.__name__} training output: {m}")
        expected.pow(2).mean().backward()
        got.pow(2).mean().backward()
    torch.testing.assert_close(on_xla.weight.grad.cpu(), on_cpu.weight.grad,
                               msg=lambda m: f"{layer.__name__}.weight.grad on XLA: {m}")
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(on_xla, name).cpu(), getattr(on_cpu, name),
                                   msg=lambda m, name=name: f"{layer.__name__}.{name} after 3 steps on XLA: {m}")
    on_cpu.eval(), on_xla.eval()
    torch.testing.assert_close(on_xla(batches[0].to(XLA)).cpu(), on_cpu(batches[0]),
                               msg=lambda m: f"{layer.__name__} eval output after training: {m}")


def test_batch_norm_running_variance_under_torch_compile_matches_pytorch(accel):
    # Compiled, the graph comes from PyTorch's decomposition, which blends the unbiased variance itself.
    torch.manual_seed(0)
    on_cpu = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6))
    on_xla = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).to(XLA)
    on_xla.load_state_dict(on_cpu.state_dict())
    on_xla.compile(backend="openxla")
    for _ in range(3):
        x = torch.randn(8, 4)
        on_cpu(x).sum().backward()
        on_xla(x.to(XLA)).sum().backward()
    torch.testing.assert_close(on_xla[1].running_var.cpu(), on_cpu[1].running_var,
                               msg=lambda m: f"BatchNorm1d.running_var after 3 compiled steps on XLA: {m}")
