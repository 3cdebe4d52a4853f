"""The case table fixtures/training_cases.toml: which script trains with which config on how many ranks."""

import dataclasses
from pathlib import Path

import tomllib

from .paths import FIXTURES, TRAINING_CASES


@dataclasses.dataclass(frozen=True)
class TrainingCase:
    """One row of fixtures/training_cases.toml: a script trained with a config on some ranks."""
    area: str
    id: str
    script: str  # relative to fixtures/
    config: str  # relative to fixtures/
    precision: str  # a table of fixtures/tolerances.toml
    ranks: int
    steps: int
    args: tuple = ()

    @property
    def sources(self):
        """The fixture files the case's losses depend on (besides the installed stack)."""
        return (self.script, self.config)

    def run(self, candidate, workdir, timeout=600):
        """Train this case on `candidate` (None: DeepSpeed's CPU accelerator); a TrainingRun."""
        from .training import run_training
        return run_training(FIXTURES / self.script, FIXTURES / self.config, candidate, workdir,
                            world_size=self.ranks, steps=self.steps,
                            launcher="python" if self.ranks == 1 else "deepspeed", extra_args=self.args,
                            timeout=timeout)


def training_areas(path=TRAINING_CASES):
    """The areas with a table in fixtures/training_cases.toml."""
    return list(tomllib.loads(Path(path).read_text()))


def training_cases(area, path=TRAINING_CASES):
    """The cases of `area` in fixtures/training_cases.toml, in file order."""
    table = tomllib.loads(Path(path).read_text())[area]
    return [TrainingCase(area=area, id=case_id, script=fields.get("script", table["script"]),
                         config=fields["config"], precision=fields["precision"], ranks=fields["ranks"],
                         steps=fields.get("steps", table["steps"]), args=tuple(fields.get("args", ())))
            for case_id, fields in table["cases"].items()]
