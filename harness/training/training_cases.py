"""The case table fixtures/training_cases.toml: which script trains with which config on how many ranks."""

import dataclasses
from pathlib import Path

import tomllib

from harness.paths import FIXTURES, TRAINING_CASES

# The keys of an area table that are the area's own; every other key is a default for its cases.
AREA_KEYS = ("reference", "cases")


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
    # the ranks of the reference run, where it cannot run on `ranks` (Trainer and Accelerate run DeepSpeed on the CPU
    # accelerator in one process only): the one-process run with the same global batch; None: `ranks`
    reference_ranks: int | None = None
    # the config the reference trains, where the case's cannot run on DeepSpeed's CPU accelerator (ZeRO++'s
    # quantized weights: it has no quantizer): the same training without that feature, compared within the
    # case's own tolerance row; None: `config`
    reference_config: str | None = None
    # hosts the candidate's ranks are spread over (`deepspeed --hostfile`, ranks / hosts per host, on a bed of
    # hosts on this machine: harness/multihost.py); the reference trains the same ranks on one host
    hosts: int = 1
    # the area's own fields, which only its checks read (a checkpoint's save_after, a graph step's allowance)
    area_fields: dict = dataclasses.field(default_factory=dict, hash=False)

    @property
    def sources(self):
        """The fixture files the case's losses (the candidate's and the reference's) depend on, besides the
        installed stack."""
        return (self.script, self.config) + ((self.reference_config, ) if self.reference_config else ())

    def run(self, candidate, workdir, extra_args=(), timeout=600):
        """Train this case on `candidate` (None: DeepSpeed's CPU accelerator), its args followed by
        `extra_args`; a TrainingRun. The reference trains on `reference_ranks` and with `reference_config` where
        set, on one host."""
        from harness.training.training import run_training
        ranks = self.ranks if candidate is not None or self.reference_ranks is None else self.reference_ranks
        config = self.config if candidate is not None or self.reference_config is None else self.reference_config
        return run_training(FIXTURES / self.script, FIXTURES / config, candidate, workdir,
                            world_size=ranks, steps=self.steps,
                            launcher="python" if ranks == 1 else "deepspeed",
                            hosts=self.hosts if candidate is not None else 1,
                            extra_args=(*self.args, *extra_args), timeout=timeout)


CASE_FIELDS = tuple(field.name for field in dataclasses.fields(TrainingCase) if field.name not in ("area", "id", "area_fields"))


def _areas(path):
    return tomllib.loads(Path(path).read_text())


def training_areas(path=TRAINING_CASES):
    """The areas of fixtures/training_cases.toml whose cases train against a CPU reference curve: those
    `python -m harness references` records and `--reference stored` reads. An area table with
    `reference = false` (its checks compare other runs: checkpoint, graph) is left out."""
    return [area for area, table in _areas(path).items() if table.get("reference", True)]


def training_cases(area, path=TRAINING_CASES):
    """The cases of `area` in fixtures/training_cases.toml, in file order: each case's fields over the
    area table's defaults; those TrainingCase does not name become its area_fields."""
    table = _areas(path)[area]
    defaults = {key: value for key, value in table.items() if key not in AREA_KEYS}
    cases = []
    for case_id, own in table["cases"].items():
        fields = {**defaults, **own}
        named = {name: fields.pop(name) for name in CASE_FIELDS if name in fields}
        cases.append(TrainingCase(area=area, id=case_id, **{**named, "args": tuple(named.get("args", ()))},
                                  area_fields=fields))
    return cases
