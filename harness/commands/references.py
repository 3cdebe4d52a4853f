"""`python -m harness references [--area AREA] [-k TEXT] [--out DIR]`: train the training cases on DeepSpeed's CPU
accelerator and store their reference curves (training/references.py)."""

import tempfile

from harness.paths import REPO
from harness.training import references, training_cases
from harness.usage import UsageError


def add_parser(commands):
    """Add the `references` subcommand and its options to `commands`; returns its parser."""
    record = commands.add_parser("references", help="train and store the CPU reference curve of every training case "
                                 f"({references.REFERENCES.relative_to(REPO)}/)")
    record.add_argument("--area", choices=training_cases.training_areas(), help="only this area's cases (default: all)")
    record.add_argument("-k", dest="select", default="", help="only cases whose id contains this text")
    record.add_argument("--out", default=str(references.REFERENCES),
                        help="where to store them (default: where `run --reference stored` reads them)")
    return record


def run(args):
    """`references`: train the selected training cases on CPU and store their curves under --out; 0, 1 when a case failed to
    train, 130 on Ctrl-C (curves already written stay). UsageError when -k selects no case."""
    cases = [case for area in ([args.area] if args.area else training_cases.training_areas())
             for case in training_cases.training_cases(area) if args.select in case.id]
    if not cases:
        raise UsageError(f"no training case id contains {args.select!r} (fixtures/training_cases.toml)")
    print(f"harness: recording the CPU reference curves of {len(cases)} training case(s) -> {args.out}", flush=True)
    recorded = []
    say = lambda line: print(f"harness: {line}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="harness-references-") as workdir:
            failed = references.regenerate(cases, workdir, root=args.out, say=say, recorded=recorded)
    except KeyboardInterrupt:  # each curve is written as it is trained: the finished ones stay
        say(f"interrupted: {len(recorded)} of {len(cases)} trained (their curves are written)")
        return 130
    say(f"{len(recorded)} trained, {len(failed)} failed")
    return 1 if failed else 0
