"""transformers' Trainer and Accelerate run DeepSpeed on XLA devices, under DS_ACCELERATOR=xla.

Both libraries decide their mode before they look at DeepSpeed: whenever torch_xla imports, Accelerate
picks its own `XLA` distributed type over torch_xla's `xla` process group, with the world size of the
PJRT runtime (1 in each process on PJRT CPU), and transformers' Trainer takes torch_xla's own steps
(`xm.optimizer_step`, `mark_step`, XLA FSDP). Under DeepSpeed's launcher that ends in DeepSpeed's batch-size
assertion (`train_batch_size ... 4 != 4 * 1 * 2`); on a TPU VM it would run DeepSpeed over a process group
without AVG, a barrier or coalesced all-reduce.

With DS_ACCELERATOR=xla the user has chosen DeepSpeed's XLA accelerator, so both libraries are made to see
DeepSpeed's world instead, with post-import hooks (no file of theirs is edited):

* `accelerate.utils.imports` and `transformers.utils.import_utils`: torch_xla counts as absent for them
  (what `USE_TORCH_XLA=0` does), so neither takes its XLA-only path;
* `transformers.training_args`: `bf16=True` is checked against the accelerator's `is_bf16_supported()` (with
  torch_xla hidden, transformers would find no bf16 device and refuse it); and `optim="adamw_torch_fused"`,
  TrainingArguments' default on torch >= 2.8, becomes `"adamw_torch"`, the same AdamW unfused (what transformers
  takes below torch 2.8): torch's fused AdamW has no XLA kernel, and refuses XLA parameters at the first step, so
  a Trainer whose DeepSpeed config names no optimizer could not train;
* `transformers.modeling_utils`: no hub kernels (the `kernels` library's device kernels: none exists for XLA, and
  it refuses a model whose parameters are on an XLA device, as `from_pretrained` under `zero.Init` makes them);
* `accelerate.state.PartialState`: for a DeepSpeed run (`ACCELERATE_USE_DEEPSPEED`, which Trainer sets for a
  `deepspeed=` config and `Accelerator(deepspeed_plugin=...)` and `accelerate launch --use_deepspeed` set)
  started by a launcher (LOCAL_RANK), the backend is the accelerator's (`xla_ds`) and DeepSpeed initialises
  it, so rank, world size and local rank are the launcher's; the device is DeepSpeed's accelerator's
  (`xla:0`) in every run, one process or many.

A multi-process run without DeepSpeed under DS_ACCELERATOR=xla has no transport here (DDP over XLA is
Accelerate's XLA mode): it stops with one line. Versions outside the tested majors (TESTED) stop with one
line too, rather than misbehave.
"""

import importlib.metadata
import os

from xla_host.import_hooks import PostImportHook, arm, wrap_once

# The majors these hooks were written against; the exact tested versions are pinned in constraints.txt.
TESTED = {"transformers": 5, "accelerate": 1}


def _major(distribution):
    return int(importlib.metadata.version(distribution).split(".")[0])


def check_version(distribution):
    """Stop the process with one line (SystemExit) when `distribution`'s major version is not the tested one."""
    installed = importlib.metadata.version(distribution)
    if _major(distribution) != TESTED[distribution]:
        raise SystemExit(f"deepspeed_xla: {distribution} {installed} is not supported under DS_ACCELERATOR=xla "
                         f"(tested with {distribution} {TESTED[distribution]}.x): install "
                         f"'{distribution}>={TESTED[distribution]},<{TESTED[distribution] + 1}', or unset DS_ACCELERATOR "
                         f"to use {distribution}'s own XLA mode without DeepSpeed")


def is_deepspeed_run(environ=os.environ):
    """Whether Accelerate is being set up for DeepSpeed (ACCELERATE_USE_DEEPSPEED, as Trainer, DeepSpeedPlugin and
    `accelerate launch --use_deepspeed` set it)."""
    return environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")


def _launched(environ=os.environ):
    return int(environ.get("LOCAL_RANK", -1)) != -1


def _world_size(environ=os.environ):
    return int(environ.get("WORLD_SIZE", 1))


def _hide_torch_xla_from_accelerate(module):
    check_version("accelerate")
    module._torch_xla_available = False
    module._tpu_available = False


def _hide_torch_xla_from_transformers(module):
    check_version("transformers")
    module.USE_TORCH_XLA = "0"
    module.is_torch_xla_available.cache_clear()  # in case something asked before this hook ran


def _training_args_for_accelerator(module):
    def is_torch_bf16_gpu_available():
        from deepspeed.accelerator import get_accelerator
        return get_accelerator().is_bf16_supported()
    module.is_torch_bf16_gpu_available = is_torch_bf16_gpu_available

    names = module.OptimizerNames

    def unfused_adamw(post_init):
        def __post_init__(self):
            post_init(self)
            if self.optim == names.ADAMW_TORCH_FUSED:
                self.optim = names.ADAMW_TORCH
        return __post_init__

    wrap_once(module.TrainingArguments, "__post_init__", unfused_adamw)


def _no_hub_kernels(module):
    module._kernels_enabled = lambda: False  # what USE_HUB_KERNELS=NO does


def _route_partial_state(module):
    state = module.PartialState
    distributed_type = module.DistributedType

    original_prepare_backend = state._prepare_backend
    original_set_device = state.set_device

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        if cpu or sagemaker_dp or not _launched() or (not is_deepspeed_run() and _world_size() == 1):
            return original_prepare_backend(self, cpu, sagemaker_dp, backend)
        if not is_deepspeed_run():
            raise SystemExit("deepspeed_xla: a multi-process transformers/Accelerate run without DeepSpeed under "
                             "DS_ACCELERATOR=xla: pass a DeepSpeed config (TrainingArguments(deepspeed=...), "
                             "Accelerator(deepspeed_plugin=...), accelerate launch --use_deepspeed), or unset "
                             "DS_ACCELERATOR to use Accelerate's own XLA mode")
        from deepspeed.accelerator import get_accelerator
        # Accelerate hands this backend to deepspeed.init_distributed, then reads rank and world size from
        # torch.distributed.
        return get_accelerator().communication_backend_name(), distributed_type.DEEPSPEED

    def set_device(self):
        if self.device is not None or self._cpu:
            return original_set_device(self)
        from deepspeed.accelerator import get_accelerator
        accelerator = get_accelerator()
        local_rank = max(int(os.environ.get("LOCAL_RANK", 0)), 0)
        accelerator.set_device(local_rank)
        self.device = accelerator.device(local_rank)

    state._prepare_backend = _prepare_backend
    state.set_device = set_device


_HOOKS = (
    PostImportHook("accelerate.utils.imports", _hide_torch_xla_from_accelerate),
    PostImportHook("transformers.utils.import_utils", _hide_torch_xla_from_transformers),
    PostImportHook("transformers.training_args", _training_args_for_accelerator),
    PostImportHook("transformers.modeling_utils", _no_hub_kernels),
    PostImportHook("accelerate.state", _route_partial_state),
)


def install():
    """Arm the hooks for this process (a no-op for libraries never imported; acts at once on those already imported)."""
    for hook in _HOOKS:
        arm(hook)
