"""`python -m harness bench [--only NAME] [--report RUN_DIR] [-- ARGS]`: the benchmarks in benchmarks/, each in a
process of its own printing its ratios side by side."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import child_processes, environment
from harness.paths import BENCHMARKS, REPO
from harness.report import report_files, report_json, report_md
from harness.usage import UsageError

# Benchmarks that run only when --only names them: the soak's 200 trainings take hours on 2 cores.
ON_REQUEST = ("soak", )


def benchmark_names():
    """Sorted names of the benchmarks `bench` can run: the stems of benchmarks/*.py, leaving out _private modules."""
    return sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))


def add_parser(commands):
    """Add the `bench` subcommand and its options to `commands`; returns its parser."""
    bench = commands.add_parser("bench", help="run the benchmarks in benchmarks/ (ratios measured side by side)")
    bench.add_argument("--only", choices=benchmark_names(),
                       help=f"only this benchmark (default: all but {', '.join(ON_REQUEST)}, which run only when named)")
    bench.add_argument("--report", metavar="RUN_DIR",
                       help="a run directory (e.g. reports/latest): its report.json and report.md get a "
                            "Performance section with these tables")
    bench.add_argument("benchmark_args", nargs=argparse.REMAINDER,
                       help="after --, with --only: arguments for that benchmark (e.g. -- --only 1-fp32-1 --no-cpu)")
    return bench


def run(args):
    """Each benchmark runs in a process of its own and prints its table; exit 1 if one misses its target.
    With --report, the tables also go into that run's report (report.json "performance", report.md): the
    report is checked before anything runs. A benchmark that stops with a usage error (exit 2: arguments
    it does not take) adds no table; exit 2. A Ctrl-C or SIGTERM stops the benchmark running (its ranks
    with it; a second one kills them) and adds the finished benchmarks' tables only; exit 130."""
    benchmark_args = [arg for arg in args.benchmark_args if arg != "--"]
    if benchmark_args and not args.only:
        raise UsageError(f"arguments {' '.join(benchmark_args)!r} for a benchmark need --only NAME to say which")
    if {"--worker", "-h", "--help"} & set(benchmark_args):
        raise UsageError(f"--worker and --help are not arguments to measure with; run python benchmarks/{args.only}.py "
                         "--help for the benchmark's own")
    extended = _report_to_extend(args.report)
    tables, children, current, interrupted = [], [], "start-up", None
    try:
        revision = environment.git_revision(REPO)
        for name in [args.only] if args.only else [name for name in benchmark_names() if name not in ON_REQUEST]:
            current = name
            print(f"harness: benchmark {name} (benchmarks/{name}.py)", flush=True)
            # Each child stays referenced until the end: a Popen freed here could take a Ctrl-C with it.
            with child_processes.interrupts_held():  # an interrupt while it starts would orphan the child
                children.append(subprocess.Popen([sys.executable, str(BENCHMARKS / f"{name}.py"), *benchmark_args],
                                                 cwd=REPO, text=True, stdout=subprocess.PIPE, start_new_session=True,
                                                 preexec_fn=child_processes.dies_with_parent))
            output = []
            for line in children[-1].stdout:
                print(line, end="", flush=True)
                output.append(line)
            status = children[-1].wait()
            if status == 2:
                raise UsageError(f"benchmarks/{name}.py stopped with a usage error (exit 2, above); no table was added")
            tables.append({"benchmark": name, "exit": status, "output": "".join(output), "arguments": benchmark_args,
                           "recorded": time.strftime("%Y-%m-%d %H:%M %Z"), "revision": revision})
    except KeyboardInterrupt:
        interrupted = current
        if children and children[-1].poll() is None:
            child_processes.stop_interrupted(children[-1])
    finally:
        for child in children:
            child_processes.reap(child)
    if extended is not None and tables:
        report_path, report = extended
        ran = {table["benchmark"] for table in tables}
        report["performance"] = [t for t in report.get("performance", []) if t["benchmark"] not in ran] + tables
        with child_processes.interrupts_held():  # a report half written is worse than a Ctrl-C answered late
            report_files.rewrite_summaries(report, report_path.parent)
        print(f"harness: performance tables added to {report_path.parent}/report.md", flush=True)
    if interrupted:
        print(f"harness: bench interrupted during {interrupted}; its table is not kept", file=sys.stderr, flush=True)
        return 130
    return 1 if any(table["exit"] for table in tables) else 0


def _report_to_extend(run_dir):
    """(path of report.json, the report) of the run directory --report names, or None without one.
    UsageError, before anything runs, where the tables could not be added: no harness run's readable
    report.json there, a performance section bench did not write, a report that does not render, or a
    directory this process cannot write to."""
    if run_dir is None:
        return None
    report_path = Path(run_dir) / "report.json"
    if not run_dir or not report_path.is_file():
        raise UsageError(f"--report {run_dir!r}: no report.json there (give a run directory, e.g. reports/latest)")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"--report {run_dir}: report.json cannot be read ({err}); give the directory of a "
                         "finished run") from None
    if not isinstance(report, dict) or not {"summary", "results", "environment"} <= report.keys():
        raise UsageError(f"--report {run_dir}: report.json is not a harness run's report (no summary, results and "
                         "environment); give the directory of a finished run")
    if not report_json.performance_is_valid(report):
        raise UsageError(f"--report {run_dir}: report.json's performance section is not one harness bench wrote")
    try:
        report_md.render_within_limit(report)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UsageError(f"--report {run_dir}: report.json does not render as a report ({err!r}); give the "
                         "directory of a finished run") from None
    if (report_path.parent / "report.md").is_dir():
        raise UsageError(f"--report {run_dir}: report.md there is a directory; move it away and run again")
    if not os.access(report_path.parent, os.W_OK):
        raise UsageError(f"--report {run_dir}: the directory is not writable here; give a run directory you can write")
    return report_path, report
