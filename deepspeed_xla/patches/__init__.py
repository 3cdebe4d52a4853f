"""What deepspeed_xla changes in DeepSpeed, torch, transformers and Accelerate, and when.

DeepSpeed's files are never edited: each change is a module here (or, for torch_xla's own kernels, in the
backend) with one `install()`, idempotent, that wraps or replaces what it names. A patch of a library module
arms a post-import hook (xla_host/import_hooks.py): it acts when that module loads, or at once if it has.

`PATCHES` is the whole list. Each is installed in one or both of two phases:
  PROCESS  every Python process with DS_ACCELERATOR=xla, at interpreter start (deepspeed_xla.pth) or at
           deepspeed_xla.activate(): the `deepspeed` launcher parent, its workers, spawned children.
  DEVICE   a process that uses an XLA device, when XLA_Accelerator is built (during `import deepspeed`);
           never in the launcher parent, which only starts workers.
Within a phase, patches install in the table's order; those that wrap the same DeepSpeed method nest in it.
DEVICE patches come with the XLA_Accelerator class (a subclass, such as a candidate the harness checks, has them);
PROCESS patches come with the package's activation only.
"""

import importlib
from dataclasses import dataclass

PROCESS = "process"
DEVICE = "device"

DEEPSPEED_ENGINE = "deepspeed.runtime.engine"  # loads inside `import deepspeed`; DeepSpeedEngine and its helpers


@dataclass(frozen=True)
class Patch:
    """One entry of the table: `module` (importable, with `install()`), the phases it is installed in, what it
    changes (`changes`: the library objects, and the module whose load it waits for) and why."""
    module: str
    phases: tuple
    changes: str
    why: str


PATCHES = (
    Patch("deepspeed_xla.patches.launch", (PROCESS,),
          "deepspeed.launcher.runner.main, when run or imported; a TPU worker's PJRT environment at start",
          "the runner checks every host of a multi-node run before it starts anything (multinode.py), and each TPU "
          "worker process gets the per-process topology PyTorch/XLA's own spawn would give it"),
    Patch("deepspeed_xla.patches.checkpointing", (PROCESS,),
          "TorchCheckpointEngine.save, when its module loads",
          "checkpoints hold host tensors, so they load on CPU (zero_to_fp32) as well as on XLA"),
    Patch("deepspeed_xla.patches.backward_guard", (PROCESS, DEVICE),
          "torch.autograd.Variable._execution_engine, when torch.autograd.variable loads",
          "autograd sizes its device queues at the first backward pass, before which XLA reports no devices: the "
          "runtime starts first (DEVICE too: for an accelerator built without activation)"),
    Patch("deepspeed_xla.patches.accelerator_selection", (PROCESS,),
          "deepspeed.accelerator.real_accelerator's accelerator and SUPPORTED_ACCELERATOR_LIST, when that module loads, "
          "and the same in its top-level copy `accelerator.real_accelerator` of a DeepSpeed source layout",
          "DeepSpeed binds its op builders to the accelerator it picks during its own import, and answers "
          "is_current_accelerator_supported() from that list"),
    Patch("deepspeed_xla.patches.huggingface", (PROCESS,),
          "transformers' and Accelerate's torch_xla detection, TrainingArguments' bf16 check and fused AdamW "
          "default, transformers' hub kernels, Accelerate's PartialState backend and device, when each module loads",
          "left alone, both libraries take torch_xla's own mode (a world of 1 per process on PJRT CPU) over "
          "DeepSpeed's"),
    Patch("deepspeed_xla.backend.op_fixes", (DEVICE,),
          "aten amax, amin and slice_scatter on the XLA dispatch key; the *_like and new_* factory ops on the "
          "Functionalize key; torch.nn.functional.batch_norm",
          "torch_xla 2.9 returns amax()/amin() with the default dim unreduced, lowers a copy into a slice as a select "
          "over the whole base, wraps a host tensor made from an XLA tensor without storage (torch.save fails), and "
          "blends the biased batch variance into running_var"),
    Patch("deepspeed_xla.patches.param_identity", (DEVICE,),
          "torch.nn.Module._apply; torch.Tensor.data's setter",
          "a move between CPU and XLA builds new Parameter objects, and `.data =` across them is refused: lists, "
          "optimizers and tied weights made before the move would hold stale CPU tensors"),
    Patch("deepspeed_xla.patches.optimizer_aliases", (DEVICE,), "a global torch.optim step post-hook",
          "DeepSpeed's fused optimizers update `p.data` in place: a view of the parameter taken after the step read "
          "the value before it, whose buffer the step had donated (in-process load_checkpoint, offload_states)"),
    Patch("deepspeed_xla.patches.xla_limits", (DEVICE,),
          "a global module forward pre-hook; sys.excepthook; DeepSpeedEngine._do_sanity_check, when the engine "
          "module loads",
          "what XLA cannot run (sparse gradients, fp16 without fp16 arithmetic) stops in one line that names the "
          "alternative, not deep inside a step"),
    Patch("deepspeed_xla.patches.torch_device_module", (DEVICE,), "torch.xla (a device runtime module torch looks up)",
          "torch.utils.checkpoint saves and restores device RNG state through getattr(torch, device.type)"),
    Patch("deepspeed_xla.patches.zero_buffers", (DEVICE,),
          "ZeRO-1/2/3 bucket sizes and the ZeRO-1/2 gradient partition layout, when the engine module loads",
          "XLA materialises a whole bucket when one view of it is read; DeepSpeed's default buckets exceed small "
          "models by orders of magnitude"),
    Patch("deepspeed_xla.patches.zero_param_views", (DEVICE,),
          "ZeRO-1/2's _update_model_bit16_weights and ZeRO-3's _unflatten_partitioned_parameters inside the "
          "optimizers' step, when the engine module loads",
          "parameters stay the views made with their flat buffer: new views made in the step are outputs of its "
          "graph, a second copy of the model written every step"),
    Patch("deepspeed_xla.patches.step_graphs", (DEVICE,),
          "DeepSpeedEngine.backward, step and _take_model_step, the gradient reductions of ZeRO 0-3, "
          "aten::_local_scalar_dense on XLA; the host bridge's operand read; when the engine module loads",
          "the step's graph is cut where the engine reads a value, so nothing is computed twice"),
    Patch("deepspeed_xla.patches.host_reads", (DEVICE,),
          "deepspeed.runtime.utils' overflow, inf/NaN and gradient-norm checks, when the engine module loads",
          "the same answers with fewer graph executions and host transfers per step"),
    Patch("deepspeed_xla.patches.shared_params", (DEVICE,),
          "DeepSpeedEngine._get_shared_params, when the engine module loads",
          "XLA tensors have no address (data_ptr() is 0), so DeepSpeed recorded every parameter as tied to the "
          "first; tied parameters are told by identity"),
    Patch("deepspeed_xla.patches.device_mesh", (DEVICE,),
          "deepspeed.comm.torch.TorchBackend.init_device_mesh, when that module loads",
          "PyTorch gives a DeviceMesh of device type xla no process groups, so configs with a data and sequence "
          "parallel mesh (Ulysses) stopped in deepspeed.initialize; the mesh is built from groups made for it"),
    Patch("deepspeed_xla.patches.tensor_pickling", (DEVICE,),
          "torch._utils._rebuild_device_tensor_from_cpu_tensor",
          "an XLA tensor that requires grad did not unpickle (torch.load, broadcast_object_list: AutoTP's input "
          "check): torch set requires_grad on the non-leaf copy it rebuilt"),
)

PHASES = (PROCESS, DEVICE)


def install(phase):
    """Install every patch of `phase` (PROCESS or DEVICE), in the table's order (idempotent); ValueError for
    another phase."""
    if phase not in PHASES:
        raise ValueError(f"unknown patch phase {phase!r}: expected one of {PHASES}")
    for patch in PATCHES:
        if phase in patch.phases:
            importlib.import_module(patch.module).install()
