"""What an XLA host offers, read without starting the XLA runtime, and import hooks.

Shared by the accelerator (deepspeed_xla) and the conformance harness, and part of neither:
the harness judges any candidate accelerator with these, so a broken candidate cannot break
them. Nothing here imports torch_xla or DeepSpeed: the `deepspeed` launcher parent calls it,
and on a TPU VM the process that starts the runtime owns the chips its workers need.
"""
