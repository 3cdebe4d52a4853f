"""Fixtures shared by conformance modules. The candidate is already installed by the harness
plugin (harness/session/plugin.py) when these run; checks reach it the way DeepSpeed does."""

import pytest
import torch
from assertions import assert_losses_match

from harness.candidate import candidate_env
from harness.training import references


@pytest.fixture(scope="session")
def candidate():
    """The candidate under test (harness.candidate.candidates.CandidateSpec), as the harness started this process for it:
    what a check hands to the processes it starts (training scripts, DeepSpeed's launcher, fresh interpreters)."""
    return candidate_env.current_spec()


@pytest.fixture(scope="session")
def accel():
    from deepspeed.accelerator import get_accelerator
    return get_accelerator()


@pytest.fixture(scope="session")
def xla_device():
    """The XLA device this process owns, named independently of the candidate."""
    import torch_xla  # noqa: F401
    return torch.device("xla", 0)


@pytest.fixture
def restore_device(accel):
    """Put the current device back after a check that moves it."""
    before = accel.current_device()
    yield
    accel.set_device(before)


@pytest.fixture
def trains_like_reference(request, candidate, evidence, tmp_path):
    """trains_like_reference(case, what): train a training case on the candidate and assert that every
    step's loss matches the case's CPU reference curve, trained live in this run or stored
    (fixtures/references/) as `--reference` says (harness/training/references.py); `what` names the run.
    Returns the candidate's TrainingRun."""
    mode = request.config.getoption("harness_reference")

    def check(case, what):
        reference = references.reference_for(case, mode, tmp_path / "reference")
        run = case.run(candidate, tmp_path / "candidate")
        evidence.update(reference.evidence(), config=case.config, ranks=case.ranks)
        assert_losses_match(reference.losses, run, case.precision, evidence, f"{what} ({reference.source} reference)",
                            device_type="xla")
        return run
    return check
