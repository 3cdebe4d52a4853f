"""The one owner of the environment that carries the candidate from process to process.

The orchestrator (`python -m harness run`) names the candidate in HARNESS_CANDIDATE for every
process it starts; a check process (the harness plugin), a training script, DeepSpeed's launcher
and its workers each parse it once (`current_spec()`). A process that does not run the plugin
installs the candidate from `candidate_site/sitecustomize.py` at interpreter start, when
HARNESS_CANDIDATE_AT_START is set.
"""

import functools
import os

from harness.candidate import candidates
from harness.paths import CANDIDATE_SITE, REPO

SPEC_ENV = "HARNESS_CANDIDATE"
AT_START_ENV = "HARNESS_CANDIDATE_AT_START"
CANDIDATE_VARIABLES = (SPEC_ENV, AT_START_ENV)


def child_env(spec, env, at_start=False):
    """`env` for a process that should run with candidate `spec` installed; with at_start, for a
    process that does not run the harness plugin (a training script, DeepSpeed's launcher and
    its workers), which then installs it from sitecustomize at start.

    deepspeed_xla is activated at interpreter start by DS_ACCELERATOR=xla. Any other candidate
    must not see DS_ACCELERATOR at start: DeepSpeed rejects unknown names, and deepspeed_xla's
    start-up hook would answer "xla" in the candidate's place.
    """
    env = dict(env)
    env[SPEC_ENV] = spec.canonical
    if spec.kind == "deepspeed_xla":
        env["DS_ACCELERATOR"] = "xla"
    else:
        env.pop("DS_ACCELERATOR", None)
        if at_start:
            env[AT_START_ENV] = "1"
            env = with_site_on_path(env)
    return env


def with_site_on_path(env):
    """`env` with candidate_site/ (its sitecustomize runs at interpreter start) and the repository first on
    PYTHONPATH, each once."""
    path = [str(CANDIDATE_SITE), str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}


def without_candidate(env):
    """`env` with no candidate named in it."""
    return {name: value for name, value in env.items() if name not in CANDIDATE_VARIABLES}


def accelerator_env(candidate, extra=None):
    """Environment for a process that runs on `candidate` (a CandidateSpec, installed at
    interpreter start) or, when None, on DeepSpeed's CPU accelerator (the reference): this
    process's environment plus `extra`, on PJRT CPU unless told otherwise, unbuffered so a log
    tail shows the last thing a rank said."""
    env = without_candidate({**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU"), "PYTHONUNBUFFERED": "1",
                             **(extra or {})})
    return dict(env, DS_ACCELERATOR="cpu") if candidate is None else child_env(candidate, env, at_start=True)


@functools.cache
def current_spec():
    """The CandidateSpec this process was started for (HARNESS_CANDIDATE; deepspeed_xla when unset),
    parsed once; SpecError when the variable is malformed."""
    return candidates.parse_spec(os.environ.get(SPEC_ENV, candidates.DEFAULT_SPEC))


def installs_at_start(environ=os.environ):
    """Whether this process must install its candidate at interpreter start (sitecustomize)."""
    return bool(environ.get(SPEC_ENV)) and environ.get(AT_START_ENV) == "1"


@functools.cache
def install_current():
    """Install the candidate this process was started for, once (the sitecustomize start-up hook
    may already have done it), and return it; CandidateError when it cannot be installed."""
    try:
        spec = current_spec()
    except candidates.SpecError as err:
        raise candidates.CandidateError(str(err)) from None
    return candidates.install(spec)
