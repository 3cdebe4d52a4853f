"""Unmodified DeepSpeed scripts, written the many ways users write them, train on the
candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train_styles.py holds the patterns (a parameter list, param groups, client
optimizers and LR schedulers, an optimizer callable, a model moved to the device or built
under zero.Init first, tied weights, eval between steps, a backward pass before
initialize, config schedulers, gradient clipping, DeepSpeed's default bucket sizes); the
cases are the `scripts` table of fixtures/training_cases.toml. Each trains on the candidate
and on the CPU reference (live, or its stored curve), and every step's loss must agree
within fixtures/tolerances.toml. An accelerator that loses parameter identity when
DeepSpeed moves the model fails here, silently wrong (ZeRO-0) or with a crash.
"""

import pytest
from conformance_helpers import training_case_params

pytestmark = pytest.mark.area("scripts")


@pytest.mark.parametrize("case", training_case_params("scripts"))
def test_user_script_loss_matches_cpu_reference(case, trains_like_reference):
    trains_like_reference(case, f"{' '.join(case.args)} with {case.config} on {case.ranks} rank(s)")
