"""What every subcommand shares: bad usage as one line (UsageError, exit 2), the argument parser that raises it,
and the backends a run may name."""

import argparse

PJRT_DEVICE = {"cpu": "CPU", "tpu": "TPU"}  # --backend -> the PJRT_DEVICE its processes run with


class UsageError(Exception):
    """Bad usage: reported on one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, raising UsageError where argparse would print usage and exit."""

    def error(self, message):
        """argparse's hook for bad usage: raise UsageError(message) instead of exiting."""
        raise UsageError(message)
