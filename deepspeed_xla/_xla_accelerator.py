"""XLA_Accelerator: DeepSpeed's accelerator interface on XLA devices. Scripts import it from
`deepspeed_xla.accelerator`, which makes sure DeepSpeed is imported first.

Process model: one OS process per rank, each owning one XLA device (a TPU chip, or a
PJRT CPU device in emulation), which that process sees as `xla:0`. DeepSpeed names
devices by local rank (`set_device(local_rank)`, `device_name(local_rank)`); the
local rank of this process maps to its own device.

Synchronisation choices (see streams.py): XLA runs one lazily built graph per device
in program order, so the device is "synchronized" from DeepSpeed's point of view:
data dependencies are resolved by the graph, there are no side streams to overlap
communication on, and memory is released by the runtime when tensors die, so
DeepSpeed must not insert its own waits to relieve memory pressure (each wait would
cut the graph and force a device round trip).
"""

import contextlib

import torch
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator

from xla_host import discovery

from . import backend, patches
from .backend import runtime
from .comm import BACKEND_NAME, register_backend
from .device_index import ordinal as device_index_ordinal
from .memory import MemoryAccounting
from .patches import host_reads, xla_limits
from .rng import XlaGenerator
from .streams import Event, Stream


class _TensorType:
    """Stand-in for torch.cuda.FloatTensor and friends: `T([data])` or `T(*sizes)` makes
    a tensor of that dtype on this process's XLA device; isinstance checks dtype and
    device. `T([data])` stays on the host inside DeepSpeed's host-value round trips that no
    collective takes part in (host_reads.scalars_stay_on_host)."""

    def __init__(self, dtype, device_fn):
        self.dtype = dtype
        self._device_fn = device_fn

    def __call__(self, *args):
        if len(args) == 1 and not isinstance(args[0], int):
            if host_reads.scalars_stay_on_host() and not torch.is_tensor(args[0]):
                return torch.as_tensor(args[0], dtype=self.dtype, device="cpu")
            return torch.as_tensor(args[0], dtype=self.dtype).to(self._device_fn())
        return torch.empty(*args, dtype=self.dtype, device=self._device_fn())

    def __instancecheck__(self, obj):
        return isinstance(obj, torch.Tensor) and obj.dtype == self.dtype and obj.device.type == backend.DEVICE_TYPE

    def __repr__(self):
        return f"XLA {self.dtype} tensor type"


class XLA_Accelerator(DeepSpeedAccelerator):
    """DeepSpeed's accelerator on XLA devices (`get_accelerator()` when DS_ACCELERATOR=xla): one device per rank process, a
    synchronized device (no side streams, host timers), the `xla_ds` communication backend. Construction registers that
    backend and installs the DEVICE-phase patches (patches/__init__.py: torch_xla op kernels, parameter identity,
    `torch.xla`, DeepSpeed engine hooks, up-front refusal of what XLA cannot run).

    With `launcher_parent=True` (DeepSpeed's runner and launch.py, which resolve resources and start the workers, and
    never touch a device) nothing is registered or installed, and torch_xla is not imported: the host-side answers the
    launcher asks for (device name and count, visible-device and exported variables, op builders) need none of it."""

    def __init__(self, *, launcher_parent=False):
        super().__init__()
        self._name = backend.DEVICE_TYPE
        self._communication_backend_name = BACKEND_NAME
        self._compile_backend = backend.DEFAULT_COMPILE_BACKEND
        self._current_ordinal = 0
        self._generators = {}
        self._memory = MemoryAccounting()
        self._ranges = []
        if launcher_parent:
            return
        runtime.apply_matmul_precision()
        register_backend()
        patches.install(patches.DEVICE)

    # Synchronisation model (module docstring explains the choice)
    def is_synchronized_device(self):
        return True

    def use_host_timers(self):
        return True

    def resolves_data_dependency(self):
        return True

    def handles_memory_backpressure(self):
        return True

    # Device APIs
    def _ordinal(self, device_index):
        return device_index_ordinal(device_index, self._current_ordinal)

    def device_name(self, device_index=None):
        if device_index is None:
            return self._name
        return f"{self._name}:{self._ordinal(device_index)}"

    def device(self, device_index=None):
        # As CUDA's accelerator: a torch.device. DeepSpeed uses it as engine.device (local rank -1),
        # as init_process_group's device_id, and as a context (default device for factories).
        return runtime.torch_device(self._ordinal(device_index))

    def set_device(self, device_index):
        self._current_ordinal = self._ordinal(device_index)

    def current_device(self):
        return self._current_ordinal

    def current_device_name(self):
        return f"{self._name}:{self._current_ordinal}"

    def device_count(self):
        return discovery.local_device_count()

    def synchronize(self, device_index=None):
        runtime.sync()

    # RNG APIs
    def random(self):
        return torch.random

    def default_generator(self, device_index):
        ordinal = self._ordinal(device_index)
        if ordinal not in self._generators:
            self._generators[ordinal] = XlaGenerator(runtime.torch_device(ordinal))
        return self._generators[ordinal]

    def set_rng_state(self, new_state, device_index=None):
        self.default_generator(device_index).set_state(new_state)

    def get_rng_state(self, device_index=None):
        return self.default_generator(device_index).get_state()

    def manual_seed(self, seed):
        # The device's generator only, as torch.cuda.manual_seed: DeepSpeed seeds per model-parallel
        # rank through this (activation checkpointing's RNG tracker) and expects the host RNG untouched.
        self.default_generator(None).manual_seed(seed)

    def manual_seed_all(self, seed):
        # A process owns one device, so "all" is this process's device.
        self.manual_seed(seed)

    def initial_seed(self):
        return self.default_generator(None).initial_seed()

    # Streams/Events
    @property
    def Stream(self):
        return Stream

    def stream(self, stream):
        return stream if stream is not None else contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return Stream(self.device_name(device_index))

    def default_stream(self, device_index=None):
        return Stream(self.device_name(device_index))

    @property
    def Event(self):
        return Event

    # Memory management (memory.py): the figures DeepSpeed's accounting reads, per device.
    def _device_of(self, device_index):
        return runtime.torch_device(self._ordinal(device_index))

    def empty_cache(self):
        # XLA frees a buffer as soon as no tensor refers to it: there is no cache to empty.
        return None

    def memory_allocated(self, device_index=None):
        return self._memory.usage(self._device_of(device_index))[0]

    def max_memory_allocated(self, device_index=None):
        return self._memory.peak(self._device_of(device_index))

    def reset_max_memory_allocated(self, device_index=None):
        self._memory.reset_peak(self._device_of(device_index))

    def memory_cached(self, device_index=None):
        return self.memory_allocated(device_index)

    def max_memory_cached(self, device_index=None):
        return self._memory.peak(self._device_of(device_index))

    def reset_max_memory_cached(self, device_index=None):
        self._memory.reset_peak(self._device_of(device_index))

    def memory_stats(self, device_index=None):
        return self._memory.stats(self._device_of(device_index))

    def reset_peak_memory_stats(self, device_index=None):
        self._memory.reset_peak(self._device_of(device_index))

    def memory_reserved(self, device_index=None):
        return self.memory_allocated(device_index)

    def max_memory_reserved(self, device_index=None):
        return self._memory.peak(self._device_of(device_index))

    def total_memory(self, device_index=None):
        return self._memory.usage(self._device_of(device_index))[2]

    def available_memory(self, device_index=None):
        return self._memory.available(self._device_of(device_index))

    # Data types
    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        return runtime.supports_fp16(discovery.device_type())

    def is_fp64_supported(self):
        # DeepSpeed accumulates gradient norms in fp64 where this is true. TPUs have no
        # fp64 units, and on PJRT CPU torch_xla 2.9 builds an invalid graph from ZeRO-3's
        # fp64 norm path (HLO verifier: f64/f32 mix in the gradient bucket, from step 2).
        # Norms accumulate in fp32, as DeepSpeed does on MPS.
        return False

    def supported_dtypes(self):
        dtypes = [torch.float, torch.bfloat16]
        if self.is_fp16_supported():
            dtypes.append(torch.float16)
        return dtypes

    # Misc
    def is_available(self):
        return discovery.local_device_count() > 0

    def range_push(self, msg, domain=None, category=None):
        self._ranges.append(runtime.trace_range(msg))
        self._ranges[-1].__enter__()

    def range_pop(self, domain=None):
        if self._ranges:
            self._ranges.pop().__exit__(None, None, None)

    def lazy_call(self, callback):
        return callback()

    def communication_backend_name(self):
        return self._communication_backend_name

    def is_triton_supported(self):
        return False

    def is_current_stream_capturing(self):
        return False

    # Graph operations: XLA traces and caches whole step graphs itself; CUDA-graph style
    # capture has no XLA equivalent, so asking for it is an error, not a silent no-op.
    def _no_graphs(self, *args, **kwargs):
        raise NotImplementedError("XLA compiles and caches step graphs itself; CUDA-graph capture and replay "
                                  "do not exist on XLA. Disable graph capture (e.g. cuda_graph) for XLA runs.")

    create_graph = capture_to_graph = replay_graph = _no_graphs

    # Tensor operations
    BFloat16Tensor = property(lambda self: _TensorType(torch.bfloat16, self._current_torch_device))
    ByteTensor = property(lambda self: _TensorType(torch.uint8, self._current_torch_device))
    DoubleTensor = property(lambda self: _TensorType(torch.float64, self._current_torch_device))
    FloatTensor = property(lambda self: _TensorType(torch.float32, self._current_torch_device))
    HalfTensor = property(lambda self: _TensorType(torch.float16, self._current_torch_device))
    IntTensor = property(lambda self: _TensorType(torch.int32, self._current_torch_device))
    LongTensor = property(lambda self: _TensorType(torch.int64, self._current_torch_device))

    def _current_torch_device(self):
        return runtime.torch_device(self._current_ordinal)

    # Host memory: transfers to XLA devices need no page-locked buffers, and torch can
    # only page-lock for CUDA. Nothing is pinned; DeepSpeed's accounting is told so.
    _torch_pins_host_memory = False

    def _torch_pin_memory(self, tensor):
        return tensor

    def _torch_empty_pinned(self, tensor, shape):
        return tensor.new_empty(shape)

    def _torch_is_pinned(self, tensor):
        return False

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    # Op builders: see op_builder/builder.py for the rule.
    def op_builder_dir(self):
        return "deepspeed_xla.op_builder"

    def create_op_builder(self, class_name):
        builder_class = self.get_op_builder(class_name)
        return builder_class() if builder_class is not None else None

    def get_op_builder(self, class_name):
        from .op_builder.builder import get_builder_class
        return get_builder_class(class_name)

    def build_extension(self):
        from torch.utils.cpp_extension import BuildExtension
        return BuildExtension

    def export_envs(self):
        # Prefixes DeepSpeed's multi-node runners forward to every worker.
        return ["PJRT_", "XLA_", "TPU_", "LIBTPU_", "DS_ACCELERATOR", "DS_XLA_"]

    def visible_devices_envs(self):
        return ["TPU_VISIBLE_CHIPS"]

    def set_visible_devices_envs(self, current_env, local_accelerator_ids):
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def get_compile_backend(self):
        return self._compile_backend

    def set_compile_backend(self, backend):
        supported = torch._dynamo.list_backends(exclude_tags=())
        if backend not in supported:
            raise ValueError(f"{backend} is not a torch.compile backend here; available: {supported}")
        xla_limits.check_compile_backend(backend)
        self._compile_backend = backend


XLA_Accelerator.__module__ = "deepspeed_xla.accelerator"  # its public import path, as reports and reprs name it
