"""A candidate whose constructor raises: the run must fail with the reason, not a traceback."""

from deepspeed_xla.accelerator import XLA_Accelerator


class FailsToConstruct(XLA_Accelerator):

    def __init__(self):
        raise RuntimeError("no XLA device configured for this candidate")
