"""Shared setup for the project's own tests: PJRT CPU unless told otherwise."""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
