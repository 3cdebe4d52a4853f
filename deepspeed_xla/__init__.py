"""XLA accelerator for DeepSpeed.

`DS_ACCELERATOR=xla` selects `XLA_Accelerator` in every Python process that imports
DeepSpeed (see `_activation`). Importing this package stays cheap: the accelerator and
torch_xla load only when asked for.
"""

__version__ = "0.1.0"
__all__ = ["XLA_Accelerator", "activate"]


def activate():
    """Install XLA_Accelerator as DeepSpeed's accelerator in this process, explicitly.

    Must run before anything imports DeepSpeed: DeepSpeed binds its op builders to the
    accelerator it finds during its own import.
    """
    from . import _activation
    _activation.install()
    import deepspeed.accelerator
    return deepspeed.accelerator.get_accelerator()


def __getattr__(name):
    if name == "XLA_Accelerator":
        from .accelerator import XLA_Accelerator
        return XLA_Accelerator
    raise AttributeError(f"module 'deepspeed_xla' has no attribute {name!r}")
