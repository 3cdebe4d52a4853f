"""An accelerator whose create_op_builder kills its process (a native abort, as a broken
extension load does): one check crashes, and every other check must still run."""

import os

from deepspeed_xla.accelerator import XLA_Accelerator


class CrashesInCreateOpBuilder(XLA_Accelerator):

    def create_op_builder(self, class_name):
        if os.environ.get("HARNESS_OUT"):  # only inside the harness's check process, not while DeepSpeed imports
            os.abort()
        return super().create_op_builder(class_name)
