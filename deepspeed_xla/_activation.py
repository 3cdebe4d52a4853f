"""Activation: what runs in every Python process where DS_ACCELERATOR=xla.

`deepspeed_xla.pth` calls `install()` at interpreter start only when DS_ACCELERATOR=xla, so every
process qualifies: the `deepspeed` launcher parent, the workers it starts, and multiprocessing
spawn/forkserver children (`deepspeed_xla.activate()` calls it too). It installs the patches of the
PROCESS phase (patches/__init__.py), each a post-import hook or a cheap setting: nothing here imports
torch, torch_xla or DeepSpeed.
"""

from . import patches


def install():
    """Install the PROCESS-phase patches for this process (idempotent); RuntimeError when DeepSpeed was imported
    first (accelerator_selection.py)."""
    patches.install(patches.PROCESS)
