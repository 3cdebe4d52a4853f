"""HuggingFace users' DeepSpeed runs train on the candidate exactly as on DeepSpeed's CPU accelerator.

fixtures/train_hf.py trains tiny Llama, GPT-2 and BERT models (from configs, seeded) through
`deepspeed.initialize`, `transformers.Trainer(deepspeed=...)` and Accelerate's `DeepSpeedPlugin`, started as
users start them: one rank as `python train_hf.py`, more through DeepSpeed's launcher. The cases are the
`huggingface` table of fixtures/training_cases.toml. Trainer and Accelerate decide their mode before they
look at DeepSpeed (torch_xla's own XLA mode, world size 1 per process on PJRT CPU): a candidate that does
not route them through DeepSpeed's world stops at DeepSpeed's batch-size assertion at two ranks. Every
step's loss must agree within fixtures/tolerances.toml with the CPU reference: the same run, or, at more
ranks, the one-process run with the same global batch. After the case's `warmup_steps` (the first steps compile
the step, the optimizer's state and, with evaluation, the evaluation graphs) no step may compile a new XLA graph:
the shapes are fixed.
"""

import pytest
from assertions import assert_no_compilations_after_warmup
from conformance_helpers import training_case_params

pytestmark = pytest.mark.area("huggingface")


@pytest.mark.parametrize("case", training_case_params("huggingface"))
def test_huggingface_loss_matches_cpu_reference(case, trains_like_reference, evidence):
    what = f"{' '.join(case.args)} with {case.config} on {case.ranks} rank(s)"
    run = trains_like_reference(case, what)
    assert_no_compilations_after_warmup(run, case.area_fields["warmup_steps"], evidence, what)
