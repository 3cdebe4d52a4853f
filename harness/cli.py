"""`python -m harness SUBCOMMAND ...`: one module per subcommand, each with `add_parser(commands)` and `run(args)`.

  run         the conformance suite against a candidate accelerator (commands/run.py)
  references  record the stored CPU reference curves (commands/references.py)
  upstream    DeepSpeed's own unit tests against the candidate and DeepSpeed's CPU accelerator (upstream/upstream.py)
  diff        regressions, fixes and new checks between two report.json files (report/report_diff.py)
  bench       the benchmarks in benchmarks/, each printing its ratios side by side (commands/bench.py)

Exit status: what the subcommand returns (0 when nothing failed unexpectedly, 1 otherwise, 130 when interrupted), or 2
on bad usage, with a one-line reason.
"""

import sys

from harness import child_processes, environment
from harness.commands import bench, references, run
from harness.report import report_diff
from harness.upstream import upstream
from harness.usage import ArgumentParser, UsageError

SUBCOMMANDS = (run, references, upstream, report_diff, bench)


def _parser():
    parser = ArgumentParser(prog="python -m harness", description="DeepSpeed XLA accelerator conformance harness")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(commands).set_defaults(run=subcommand.run)
    return parser


def main(argv=None):
    """Entry point of `python -m harness`: the exit status of the subcommand `argv` (default sys.argv[1:]) names, or 2 with
    a one-line `harness: error:` on stderr for bad usage (argparse errors and stale DeepSpeed op build locks included)."""
    child_processes.interrupts_raise()  # a SIGTERM too: children stopped, report written, marked incomplete
    extensions = environment.use_stack_extensions()
    try:
        args = _parser().parse_args(argv)
        stale = environment.stale_lock_line(environment.stale_build_locks(extensions))
        if stale and args.command != "diff":
            raise UsageError(stale)
        return args.run(args)
    except UsageError as err:
        print(f"harness: error: {err}", file=sys.stderr)
        return 2
