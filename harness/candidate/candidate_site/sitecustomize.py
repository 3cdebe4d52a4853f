"""Installs the harness's candidate accelerator at interpreter start, and on the candidate's side of
`upstream`, the candidate's answer to DeepSpeed's bf16 test helper (harness/upstream/bf16_check.py).

The harness puts this folder on PYTHONPATH for the processes a conformance check starts
(a training script, DeepSpeed's launcher and its workers), so an unmodified script runs
with the candidate under test. deepspeed_xla needs none of this (DS_ACCELERATOR=xla
activates it); every other candidate is installed here, before DeepSpeed is imported.
"""

import os
import sys

if "HARNESS_CANDIDATE_AT_START" in os.environ:  # harness.candidate.candidate_env owns the variables; this only avoids
    from harness.candidate import candidate_env  # importing the harness into processes that have none
    from harness.candidate.candidates import CandidateError
    if candidate_env.installs_at_start():
        try:
            candidate_env.install_current()
        except CandidateError as err:
            sys.exit(f"harness: {err}")

if "HARNESS_UPSTREAM_BF16_CHECK" in os.environ:  # harness.upstream.bf16_check.ENV
    from harness.upstream import bf16_check
    bf16_check.install()
