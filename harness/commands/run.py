"""`python -m harness run --backend {cpu,tpu} --candidate SPEC --suite NAME --out DIR`: the conformance suite.

The checks run in a child pytest process (this process never starts a device runtime: on a TPU host, the process
that does owns the chips); this process turns what the child streamed into the reports. Exit status: 0 when nothing
failed unexpectedly, 1 on unexpected failures (or a run that did not complete), 2 on bad usage.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

from harness import child_processes, environment
from harness.candidate import candidate_env, candidates
from harness.paths import REPO
from harness.report import curves, report_files, report_json, run_dir
from harness.report.run_dir import OUT_ENV
from harness.session import expectations, outcomes, suites
from harness.session.resume import run_until_every_check_ran
from harness.training import references
from harness.usage import PJRT_DEVICE, UsageError

# pytest exit codes after which the child ran what it collected (0 passed, 1 failures, 5 nothing)
_FINISHED = (0, 1, 5)


def add_parser(commands):
    """Add the `run` subcommand and its options to `commands` (cli's argparse subparsers); returns its parser."""
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
    return run


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

    Returns (the last child's exit code, interrupted); (0, False) when the checks that crashed were the last.
    Each restart runs at least one check fewer, so the loop ends.
    """
    last = {}

    def session(pending):
        last["returncode"], last["interrupted"] = _run_child([*command, *pending, *pytest_args], env)
        if last["interrupted"] or last["returncode"] in _FINISHED:
            return None, set(), False
        collected, started, finished = report_json.progress(parts)
        crashed = [nodeid for nodeid in started if nodeid not in finished]
        if collected is None or not crashed:
            return collected, set(started), False
        how = child_processes.how_it_ended(last["returncode"])
        for nodeid in crashed:
            report_json.append_lost_check(parts, nodeid, outcomes.lost_check_message(how))
        left = len([nodeid for nodeid in collected if nodeid not in set(started)])
        print(f"harness: {crashed[-1]} ended its process ({how}); {left} check(s) left, resumed in a new process",
              flush=True)
        return collected, set(started), True

    if run_until_every_check_ran(session, targets):
        return 0, False
    return last["returncode"], last["interrupted"]


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
    if report["left_out"]:
        line += f"; {len(report['left_out'])} left out by suite {report['suite']} (report.md says why)"
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
