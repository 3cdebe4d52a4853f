"""DeepSpeed's device mesh on XLA has the process groups of its dimensions.

A config with "data_parallel_size" and "sequence_parallel_size" (Ulysses), or AutoTP's mesh, makes DeepSpeed
build a `torch.distributed.device_mesh.DeviceMesh` for the accelerator's device type and take its groups from
it (`mesh.get_group(mesh_dim=...)`). PyTorch leaves a mesh of device type "xla" without process groups
(torch_xla's SPMD meshes have none), so every such config stopped in `deepspeed.initialize` with "DeviceMesh
process groups not initialized!". On XLA, `TorchBackend.init_device_mesh` makes the groups itself, as PyTorch
does for other devices (one `new_group` for each line of ranks along each dimension, every rank creating every
group in the same order), and builds the mesh from them (`DeviceMesh.from_group`). The groups use the world's
backend (`xla_ds`). Other accelerators keep DeepSpeed's own method.
"""

import functools
import math

from xla_host.import_hooks import PostImportHook, arm, wrap_once

from ..backend import DEVICE_TYPE

DEEPSPEED_COMM_TORCH = "deepspeed.comm.torch"


def mesh_with_groups(mesh_shape, mesh_dim_names):
    """A DeviceMesh of device type "xla" over the world's ranks laid out row-major in `mesh_shape`, named
    `mesh_dim_names`, whose dimension groups exist (process groups of the world's backend).
    Collective: every rank must call it. ValueError when the shape does not hold the world's ranks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.get_world_size()
    if math.prod(mesh_shape) != world:
        raise ValueError(f"device mesh {tuple(mesh_shape)} holds {math.prod(mesh_shape)} ranks, the world has {world}")
    mesh = torch.arange(world, dtype=torch.int).reshape(tuple(mesh_shape))
    rank, groups = dist.get_rank(), []
    for dim in range(mesh.ndim):
        mine = None
        for ranks in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist():
            group = dist.new_group(ranks)
            if rank in ranks:
                mine = group
        groups.append(mine)
    return DeviceMesh.from_group(groups, DEVICE_TYPE, mesh=mesh, mesh_dim_names=tuple(mesh_dim_names))


def _with_groups_on_xla(original):

    @functools.wraps(original)
    def init_device_mesh(backend, mesh_shape, mesh_dim_names):
        from deepspeed.accelerator import get_accelerator
        if get_accelerator().device_name() != DEVICE_TYPE:
            return original(backend, mesh_shape, mesh_dim_names)
        return mesh_with_groups(mesh_shape, mesh_dim_names)

    return init_device_mesh


def _give_meshes_groups(comm_torch):
    wrap_once(comm_torch.TorchBackend, "init_device_mesh", _with_groups_on_xla)


_HOOK = PostImportHook(DEEPSPEED_COMM_TORCH, _give_meshes_groups)


def install():
    """Build XLA device meshes with their process groups in TorchBackend.init_device_mesh, when
    deepspeed.comm.torch loads, or now if it has (idempotent)."""
    arm(_HOOK)
