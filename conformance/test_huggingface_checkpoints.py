"""What HuggingFace users do around training works on the candidate: a Trainer checkpoint resumes where it
stopped, and the model Trainer saves at ZeRO-3 is the model it trained.

The cases are the `huggingface_checkpoint` table of fixtures/training_cases.toml (fixtures/train_hf.py,
Trainer, 2 ranks through DeepSpeed's launcher). Each compares runs of the candidate with each other:
- resume: the uninterrupted run saves a checkpoint after step `resume_at` as Trainer's `save_steps` does and
  trains on; a second process resumes from that checkpoint (as after an interruption) and trains to the end.
  Every step after the checkpoint must have the uninterrupted run's loss (the model, the optimizer state, the
  data order and the RNG restored);
- save_model: `trainer.save_model()` with `stage3_gather_16bit_weights_on_model_save` gathers the ZeRO-3
  partitions into one `from_pretrained` directory; loaded on the CPU, the model must compute the trained
  model's loss on the first batch.
"""

import pytest
import torch
from assertions import assert_losses_match
from conformance_helpers import import_fixture_script, training_case_params

from harness.training.loss_comparison import compare_losses

pytestmark = pytest.mark.area("huggingface")


@pytest.fixture(scope="module")
def uninterrupted(candidate, tmp_path_factory):
    """case -> (the candidate's uninterrupted run of that case, with the trained model saved and a Trainer
    checkpoint after step `resume_at`; the directory it ran in, where a resumed run finds the checkpoint)."""
    runs = {}

    def train(case):
        if case.id not in runs:
            workdir = tmp_path_factory.mktemp("uninterrupted")
            runs[case.id] = (case.run(candidate, workdir, extra_args=(
                "--save-model", "--save-at", str(case.area_fields["resume_at"]))), workdir)
        return runs[case.id]
    return train


@pytest.mark.parametrize("case", training_case_params("huggingface_checkpoint"))
def test_trainer_resumes_where_it_stopped(case, candidate, uninterrupted, evidence):
    at = case.area_fields["resume_at"]
    whole, workdir = uninterrupted(case)
    resumed = case.run(candidate, workdir, extra_args=("--resume-from-step", str(at)))
    assert_losses_match(whole.losses[at:], resumed, case.precision, evidence,
                        f"{case.id} resumed from its step-{at} checkpoint", reference="the uninterrupted run")


@pytest.mark.parametrize("case", training_case_params("huggingface_checkpoint"))
def test_trainer_save_model_loads_on_cpu(case, uninterrupted, evidence):
    import transformers
    run, _ = uninterrupted(case)
    script = import_fixture_script(case.script)
    model = transformers.AutoModelForCausalLM.from_pretrained(run.reported["saved_model"])
    batch = script.collate(script.samples()[:script.GLOBAL_BATCH])
    with torch.no_grad():
        loaded = model(**batch).loss.item()
    comparison = compare_losses([run.reported["trained_model_loss"]], [loaded], case.precision)
    evidence.update(comparison, trained_model_loss=run.reported["trained_model_loss"], loaded_on_cpu_loss=loaded)
    assert comparison["ok"], (f"{case.id}: the model save_model() wrote, loaded on the CPU, gives loss {loaded} on the "
                              f"first batch; the trained model gave {run.reported['trained_model_loss']}")
