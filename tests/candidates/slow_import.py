"""A candidate whose import takes a minute (a slow backend's start), and says when it began: an
interrupt that lands meanwhile must stop the run, not make a failed candidate whose checks run on."""

import os
import time
from pathlib import Path

from deepspeed_xla.accelerator import XLA_Accelerator

Path(os.environ["SLOW_IMPORT_STARTED"]).touch()
time.sleep(60)


class SlowImport(XLA_Accelerator):
    pass
