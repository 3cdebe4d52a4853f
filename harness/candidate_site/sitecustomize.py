"""Installs the harness's candidate accelerator at interpreter start.

The harness puts this folder on PYTHONPATH for the processes a conformance check starts
(a training script, DeepSpeed's launcher and its workers), so an unmodified script runs
with the candidate under test. deepspeed_xla needs none of this (DS_ACCELERATOR=xla
activates it); every other candidate is installed here, before DeepSpeed is imported.
"""

import os
import sys

if os.environ.get("HARNESS_CANDIDATE") and os.environ.get("HARNESS_CANDIDATE_AT_START") == "1":
    from harness.candidates import CandidateError, install_from_env
    try:
        install_from_env()
    except CandidateError as err:
        sys.exit(f"harness: {err}")
