"""`python -m harness run --backend {cpu,tpu} --candidate SPEC --suite NAME --out DIR`
`python -m harness references [--area AREA] [-k TEXT] [--out DIR]`: record the stored CPU reference curves
`python -m harness bench [--only NAME]`: the benchmarks in benchmarks/, each printing its ratios side by side
`python -m harness diff OLD NEW`: regressions, fixes and new checks between two report.json files (report_diff.py)
`python -m harness upstream --deepspeed-src DIR [--selection FILE] [-k EXPR] [--candidate SPEC] [--out DIR]`:
    DeepSpeed's own unit tests against the candidate and DeepSpeed's CPU accelerator (upstream.py)

Exit status: 0 when nothing failed unexpectedly, 1 on unexpected failures (or a run that
did not complete), 2 on bad usage, with a one-line reason. The checks run in a child
pytest process (this process never starts a device runtime: on a TPU host, the process
that does owns the chips); this process turns what the child streamed into the reports.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import child_processes, environment
from harness.candidate import candidate_env, candidates
from harness.report import curves, report_diff, report_files, report_json, report_md, run_dir
from harness.session import expectations, outcomes, suites
from harness.training import references, training_cases
from harness.upstream import upstream
from harness.paths import BENCHMARKS, REPO
from harness.report.run_dir import OUT_ENV

PJRT_DEVICE = {"cpu": "CPU", "tpu": "TPU"}
# pytest exit codes after which the child ran what it collected (0 passed, 1 failures, 5 nothing)
_FINISHED = (0, 1, 5)


class UsageError(Exception):
    """Bad usage: reported on one line, exit status 2."""


class _Parser(argparse.ArgumentParser):

    def error(self, message):
        raise UsageError(message)


def _parser():
    parser = _Parser(prog="python -m harness", description="DeepSpeed XLA accelerator conformance harness")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", help="run a conformance suite against a candidate accelerator")
    run.add_argument("--backend", required=True, choices=sorted(PJRT_DEVICE), help="PJRT CPU emulation or real TPU")
    run.add_argument("--candidate", default=candidates.DEFAULT_SPEC,
                     help="deepspeed_xla (default), in-tree, module:Class or path/to/file.py:Class")
    run.add_argument("--suite", default="all", help=f"one of: {', '.join(sorted(suites.SUITES))} (default all)")
    run.add_argument("--out", help="run directory (default: reports/<run-id>/)")
    run.add_argument("--expectations", help="expectations TOML (default fixtures/expectations/<candidate>-<backend>.toml)")
    run.add_argument("--workers", type=int, default=0, help="pytest-xdist worker processes (default 0: one process)")
    run.add_argument("--timeout", type=int, default=600, help="seconds one check may take (default 600)")
    run.add_argument("--repeat", type=int, default=1,
                     help="run every selected check N times; a check whose status changes is reported flaky (default 1)")
    run.add_argument("--reference", **references.REFERENCE_OPTION)
    run.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: extra pytest arguments (e.g. -k)")
    record = commands.add_parser("references", help="train and store the CPU reference curve of every training case "
                                 f"({references.REFERENCES.relative_to(REPO)}/)")
    record.add_argument("--area", choices=training_cases.training_areas(), help="only this area's cases (default: all)")
    record.add_argument("-k", dest="select", default="", help="only cases whose id contains this text")
    record.add_argument("--out", default=str(references.REFERENCES),
                        help="where to store them (default: where `run --reference stored` reads them)")
    upstream.add_parser(commands)
    diff = commands.add_parser("diff", help="regressions, fixes and new checks between two runs' report.json")
    diff.add_argument("old", help="the earlier run's report.json (e.g. the last nightly)")
    diff.add_argument("new", help="the later run's report.json (e.g. this pull request's)")
    bench = commands.add_parser("bench", help="run the benchmarks in benchmarks/ (ratios measured side by side)")
    bench.add_argument("--only", choices=benchmark_names(),
                       help=f"only this benchmark (default: all but {', '.join(ON_REQUEST)}, which run only when named)")
    bench.add_argument("--report", metavar="RUN_DIR",
                       help="a run directory (e.g. reports/latest): its report.json and report.md get a "
                            "Performance section with these tables")
    bench.add_argument("benchmark_args", nargs=argparse.REMAINDER,
                       help="after --, with --only: arguments for that benchmark (e.g. -- --only 1-fp32-1 --no-cpu)")
    return parser




# Benchmarks that run only when --only names them: the soak's 200 trainings take hours on 2 cores.
ON_REQUEST = ("soak", )


def benchmark_names():
    """Sorted names of the benchmarks `bench` can run: the stems of benchmarks/*.py, leaving out _private modules."""
    return sorted(path.stem for path in BENCHMARKS.glob("*.py") if not path.name.startswith("_"))


def run_benchmarks(args):
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


def _plan(args):
    """Validate everything the run needs before starting anything; UsageError otherwise."""
    try:
        spec = candidates.parse_spec(args.candidate)
        modules = suites.modules_for(args.suite)
    except (candidates.SpecError, suites.UnknownSuite) as err:
        raise UsageError(str(err)) from None
    if not modules:
        raise UsageError(f"suite {args.suite!r} has no conformance modules yet "
                         f"(conformance/test_<area>_*.py for areas {', '.join(suites.SUITES[args.suite])})")
    if args.expectations and not Path(args.expectations).is_file():
        raise UsageError(f"expectations file {args.expectations} does not exist")
    expectation_path = args.expectations or expectations.default_path(spec.name, args.backend)
    try:
        expected = expectations.load(expectation_path)
    except expectations.ExpectationsError as err:
        raise UsageError(str(err)) from None
    if args.workers < 0 or args.timeout <= 0 or args.repeat < 1:
        raise UsageError("--workers must be >= 0, --timeout > 0 and --repeat >= 1")
    device_kind, device_count = environment.devices(args.backend)
    if device_count < 1:
        raise UsageError(f"--backend {args.backend}: no {device_kind} devices found on this host")
    if args.backend == "tpu":
        from xla_host.tpu_topology import chip_holders_line  # /proc only: the chips stay untouched
        holders = chip_holders_line()
        if holders:
            raise UsageError(f"--backend tpu: {holders}")
    return spec, modules, expected, device_kind, device_count


def _run_child(command, env):
    """Run the checks; (pytest exit code or -signal, interrupted by the user).

    The child runs in a session of its own, so whatever its checks start (launchers, ranks,
    pools) can be stopped with it; a Ctrl-C or SIGTERM here is forwarded to it as SIGINT, so
    pytest ends the check in progress and streams what it has.
    It gets SIGINT too when this process dies without forwarding anything (a SIGKILL, the OOM killer).
    """
    child = None
    try:
        with child_processes.interrupts_held():  # an interrupt while it starts would orphan the child
            child = subprocess.Popen(command, env=env, cwd=REPO, start_new_session=True,
                                     preexec_fn=child_processes.interrupted_with_parent)
        return child.wait(), False
    except KeyboardInterrupt:
        if child is None:
            raise
        return child_processes.stop_interrupted(child, wait_s=60), True
    finally:
        if child is not None:
            child_processes.reap(child)


def _run_isolating_crashes(command, targets, pytest_args, env, parts):
    """Run the checks; when a check ends the child process (an abort, a segfault, a kill), record it
    as an error naming how, and start a new child on the checks not yet run.

    Returns (the last child's exit code, interrupted). Each restart runs at least one check
    fewer, so the loop ends.
    """
    pending = targets
    while True:
        returncode, interrupted = _run_child([*command, *pending, *pytest_args], env)
        if interrupted or returncode in _FINISHED:
            return returncode, interrupted
        collected, started, finished = report_json.progress(parts)
        crashed = [nodeid for nodeid in started if nodeid not in finished]
        if collected is None or not crashed:
            return returncode, interrupted
        for nodeid in crashed:
            report_json.append_lost_check(parts, nodeid,
                                          outcomes.lost_check_message(child_processes.how_it_ended(returncode)))
        done = set(started)
        pending = [nodeid for nodeid in collected if nodeid not in done]
        print(f"harness: {crashed[-1]} ended its process ({child_processes.how_it_ended(returncode)}); "
              f"{len(pending)} check(s) left, resumed in a new process", flush=True)
        if not pending:
            return 0, False


def _relevant(expected, modules, suite):
    """Expectations for checks this suite runs (others cannot match, and are not 'unmatched')."""
    names = [module.relative_to(REPO).as_posix() for module in modules]
    return [e for e in expected if any(e.concerns(name) for name in names) and suites.may_select(suite, e.id)]


def repeat_dir(out, attempt):
    """Where attempt k (1-based) of a --repeat run streams its parts: the run directory, then repeat-<k>/."""
    return out if attempt == 1 else out / f"repeat-{attempt}"


def finish(*, out, run_id, suite, expected, env_fingerprint, child_rcs, interrupted):
    """Write report.json, junit.xml, report.md and plots from the run's parts (one set per attempt
    of a --repeat run, merged: a check whose status changed is flaky); returns the report."""
    parts = [repeat_dir(out, k) / "parts" for k in range(1, len(child_rcs) + 1)]
    attempts = [report_json.read_parts(path) for path in parts]
    session = attempts[0][1]
    results = outcomes.merge_attempts([results for results, _ in attempts], last_interrupted=interrupted)
    # An attempt is complete when its session finished, or when every check it collected has a
    # result (the last check crashed its process, or the process died after the last check).
    complete = not interrupted and all(
        (rc in _FINISHED and attempt_session.get("finished")) or report_json.every_check_ran(path)
        for rc, (_, attempt_session), path in zip(child_rcs, attempts, parts))
    unmatched = expectations.apply(results, expected) if complete else []
    artifacts = curves.plot_results(results, out)
    report = report_json.build(run_id=run_id, suite=suite, results=results, session=session,
                               environment=env_fingerprint, complete=complete, unmatched_expectations=unmatched,
                               artifacts=artifacts)
    report["repeat"] = len(child_rcs)
    report_files.write(report, results, out)
    return report


def _summary_line(report):
    s, cov = report["summary"], report["coverage"]["interface"]
    line = (f"{s['passed']} passed, {s['failed']} failed, {s['error']} error, {s['xfailed']} xfailed, "
            f"{s['xpassed']} xpassed, "
            f"{s['skipped']} skipped" + (f", {s['flaky']} flaky" if s["flaky"] else "")
            + f" ({s['total']} total" + (f", each run {report['repeat']} times)" if report["repeat"] > 1 else ")"))
    if "interface" in suites.SUITES[report["suite"]]:
        line += f"; interface coverage {cov['checked']}/{cov['total']}"
        if cov["unchecked"]:
            line += f" (unchecked: {', '.join(cov['unchecked'])})"
    if not report["complete"]:
        line += "; INCOMPLETE run"
    return line


def run(args):
    """`run`: the suite's checks in child pytest processes (a crashed check's process is replaced), then report.json,
    junit.xml and report.md in the run directory and reports/latest; 0 or 1 (report_files.exit_status).
    Raises UsageError (exit 2) before starting anything when the candidate, suite, expectations or devices are wrong."""
    spec, modules, expected, device_kind, device_count = _plan(args)
    run_id = run_dir.new_run_id(args.suite, args.backend)
    out = run_dir.prepare(args.out or run_dir.reports_root() / run_id)
    env = candidate_env.child_env(spec, os.environ)
    env["PJRT_DEVICE"] = PJRT_DEVICE[args.backend]
    if args.backend == "tpu":  # compare fp32 at full precision: TPUs multiply fp32 in bf16 passes by default
        env.setdefault(candidates.MATMUL_PRECISION_ENV, "highest")
    env[OUT_ENV] = str(out)
    command = [sys.executable, "-m", "pytest", "-p", "harness.session.plugin", "-p", "no:cacheprovider",
               "--rootdir", str(REPO), "--timeout", str(args.timeout), "--reference", args.reference,
               "--harness-suite", args.suite, "-q", "-rfEX",
               *(["-n", str(args.workers), "--dist", "loadfile", "-p", "harness.session.xdist_crashes"] if args.workers else [])]
    pytest_args = [a for a in args.pytest_args if a != "--"]
    print(f"harness: suite {args.suite} on {args.backend}, candidate {spec.text}: {len(modules)} modules -> {out}",
          flush=True)
    child_rcs, interrupted = [], False
    for attempt in range(1, args.repeat + 1):
        if attempt > 1:
            print(f"harness: attempt {attempt} of {args.repeat}", flush=True)
        env[OUT_ENV] = str(run_dir.prepare(repeat_dir(out, attempt)))
        child_rc, interrupted = _run_isolating_crashes(command, [str(m) for m in modules], pytest_args, env,
                                                       repeat_dir(out, attempt) / "parts")
        child_rcs.append(child_rc)
        if interrupted:
            break
    fingerprint = environment.fingerprint(args.backend, spec.text, device_kind, device_count, env)
    if args.backend == "tpu":
        fingerprint.update(environment.tpu_slice())
    report = finish(out=out, run_id=run_id, suite=args.suite, expected=_relevant(expected, modules, args.suite),
                    env_fingerprint=fingerprint, child_rcs=child_rcs, interrupted=interrupted)
    latest = run_dir.point_latest(out)
    for result in report["results"]:
        if result["status"] in report_json.FAILING:
            print(f"harness: {result['status'].upper()} {result['id']}: "
                  f"{result['message'].splitlines()[0] if result['message'] else ''}")
    for entry in report["expectations"]["unmatched"]:
        print(f"harness: expectation matched no test: {entry['id']}")
    for test_id in report["expectations"]["xpassed"]:
        print(f"harness: expected failure passed: {test_id}")
    print(f"harness: {_summary_line(report)}")
    print(f"harness: report: {out / 'report.md'} (report.json, junit.xml; latest: {latest})")
    return report_files.exit_status(report)


def record_references(args):
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
        commands = {"run": run, "references": record_references, "bench": run_benchmarks, "upstream": upstream.run,
                    "diff": report_diff.run}
        return commands[args.command](args)
    except (UsageError, upstream.UpstreamUsageError, report_diff.DiffError) as err:
        print(f"harness: error: {err}", file=sys.stderr)
        return 2
