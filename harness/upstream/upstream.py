"""`python -m harness upstream`: DeepSpeed's own unit tests, run against a candidate and against
DeepSpeed's CPU accelerator (the baseline), compared test by test.

    python -m harness upstream --deepspeed-src DIR [--selection FILE] [--subset all|pr] [-k EXPR]
                               [--candidate SPEC] [--out DIR] [--devices N] [--timeout S] [--workers N]

DIR is a DeepSpeed source checkout (the PyPI sdist has no tests) of the installed DeepSpeed's
version: DeepSpeed's tests/conftest.py puts the checkout first on sys.path, so its tests import
the checkout's deepspeed/, and another version's code would be tested under the installed
version's name (refused, exit 2). Each side is one pytest session in DIR/tests, DeepSpeed's own
conftest.py and pytest.ini in charge, set up as DeepSpeed's test harness needs for an
accelerator it does not know (never by editing its files):
  - CUDA_VISIBLE_DEVICES=0..N-1: `set_accelerator_visible()` asks a vendor tool for the
    device list of accelerators it knows, and asserts CPU for any other;
  - LOCAL_SIZE=N: `DistributedTest` skips a world larger than `device_count()`; DeepSpeed's
    CPU accelerator and deepspeed_xla count LOCAL_SIZE devices, as in a launched rank;
  - DS_UNITTEST_TIMEOUT: DeepSpeed's own bound on one test's ranks, and the watchdog's
    (upstream_run.py), so a rank that dies in DeepSpeed's pool becomes an error, not a hang;
  - on the candidate's side only, DeepSpeed's bf16 test helper also answers True where the
    candidate supports bf16, as it does for the accelerators it names (bf16_check.py).
The candidate is installed in every process DeepSpeed's harness starts (its forkserver pool
and spawned ranks) the way `run` installs it in training scripts (candidate_env.child_env).
Results join report.json / junit.xml / report.md as area `upstream` (verdicts: upstream_verdicts.py).
"""

import os
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness import environment
from harness.candidate import candidate_env, candidates
from harness.report import report_files, report_json, run_dir
from harness.session import expectations
from harness.upstream import bf16_check, upstream_run, upstream_selection, upstream_verdicts
from harness.usage import PJRT_DEVICE, UsageError

SIDES = ("baseline", "candidate")
_CLEARED = (*candidate_env.CANDIDATE_VARIABLES, "DS_ACCELERATOR", "PYTEST_ADDOPTS",
            "CUDA_VISIBLE_DEVICES", "LOCAL_SIZE", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK")


class UpstreamUsageError(UsageError):
    """Bad usage of `upstream` (one line, exit 2)."""


def add_parser(commands):
    """Add the `upstream` subcommand and its options to `commands` (cli's argparse subparsers); returns its parser."""
    up = commands.add_parser("upstream", help="run DeepSpeed's own unit tests against a candidate and against "
                             "DeepSpeed's CPU accelerator, test by test")
    up.add_argument("--deepspeed-src", required=True, metavar="DIR", help="a DeepSpeed source checkout (has tests/unit)")
    up.add_argument("--selection", metavar="FILE",
                    help="selection TOML (default fixtures/upstream/deepspeed-<installed version>.toml)")
    up.add_argument("--subset", choices=upstream_selection.SUBSETS, default="all",
                    help="all: the whole selection (nightly; default); pr: its entries marked pr = true, the "
                    "stable and quick ones a pull request's job runs")
    up.add_argument("-k", dest="keyword", default="", help="only tests matching this pytest -k expression")
    up.add_argument("--candidate", default=candidates.DEFAULT_SPEC,
                    help="deepspeed_xla (default), in-tree[:NAME], module:Class or path/to/file.py:Class")
    up.add_argument("--backend", choices=sorted(PJRT_DEVICE), default="cpu", help="PJRT CPU (default) or TPU")
    up.add_argument("--out", help="run directory (default: reports/<run-id>/)")
    up.add_argument("--devices", type=int, default=4,
                    help="devices DeepSpeed's test harness may start ranks on (default 4; PJRT CPU emulates them)")
    up.add_argument("--timeout", type=int, default=300,
                    help="seconds one test's ranks may take (DS_UNITTEST_TIMEOUT; default 300)")
    up.add_argument("--workers", type=int, default=0,
                    help="pytest-xdist processes per side (DeepSpeed's harness gives each its own ports; default 0)")
    return up


def _plan(args):
    src = Path(args.deepspeed_src).expanduser().resolve()
    tests_dir = src / "tests"
    if not (tests_dir / "unit" / "common.py").is_file():
        raise UpstreamUsageError(f"--deepspeed-src {args.deepspeed_src}: not a DeepSpeed source checkout "
                                 "(no tests/unit/common.py; the PyPI sdist has no tests: clone "
                                 "https://github.com/deepspeedai/DeepSpeed at the installed version's tag)")
    deepspeed_version = environment.installed_version("deepspeed")
    try:
        spec = candidates.parse_spec(args.candidate)
        selection = upstream_selection.load(
            args.selection or upstream_selection.default_path(deepspeed_version)).only(args.subset)
    except (candidates.SpecError, upstream_selection.SelectionError) as err:
        raise UpstreamUsageError(str(err)) from None
    if args.devices < 1 or args.timeout <= 0 or args.workers < 0:
        raise UpstreamUsageError("--devices must be >= 1, --timeout > 0 and --workers >= 0")
    _require_installed_version(src, args.deepspeed_src, deepspeed_version)
    return src, tests_dir, spec, selection


def _require_installed_version(src, given, installed):
    """Refuse a checkout whose version.txt is not the installed DeepSpeed's release (a local segment such as an
    editable install's +<git hash> aside): its tests would run its own code (tests/conftest.py puts it first on
    sys.path), not the installed DeepSpeed the report names."""
    checkout = checkout_version(src)
    if not checkout:
        raise UpstreamUsageError(f"--deepspeed-src {given}: {'no version.txt' if checkout is None else 'version.txt is empty'}"
                                 ", so which DeepSpeed its tests import cannot be told; use a DeepSpeed source checkout")
    if not same_release(checkout, installed):
        shown = checkout if checkout.isprintable() else repr(checkout)  # one line, whatever the file holds
        raise UpstreamUsageError(
            f"--deepspeed-src {given} is DeepSpeed {shown} (version.txt) but {installed} is installed; DeepSpeed's "
            "tests/conftest.py imports the checkout's own deepspeed/ first, so they would test that version's code: "
            f"check out the installed release (git -C {given} checkout v{installed}) or install the checkout "
            f"(pip install -e {given})")


def same_release(checkout, installed):
    """Whether version strings `checkout` (a version.txt) and `installed` name one release: PEP 440 versions compared
    without their local segment (an editable install's +<git hash>), so 0.19.8, 0.19.8.0 and v0.19.8 are one release
    and 0.19.8rc1, 0.19.8.post1 other ones; strings that are not versions compare as text."""
    try:
        return Version(Version(checkout).public) == Version(Version(installed).public)
    except InvalidVersion:
        return checkout == installed


def side_envs(spec, backend, devices, timeout_s, base=None):
    """{side: environment} for the baseline (DeepSpeed's CPU accelerator) and the candidate."""
    common = {key: value for key, value in (os.environ if base is None else base).items() if key not in _CLEARED}
    common.update(CUDA_VISIBLE_DEVICES=",".join(map(str, range(devices))), LOCAL_SIZE=str(devices),
                  DS_UNITTEST_TIMEOUT=str(timeout_s), PJRT_DEVICE=PJRT_DEVICE[backend])
    if backend == "tpu":  # PJRT CPU cannot load the executables it stores (PersistentCacheDeserializeFailure)
        common.setdefault("XLA_PERSISTENT_CACHE_PATH", str(Path.home() / ".cache" / "deepspeed_xla" / "xla_cache"))
    candidate = candidate_env.with_site_on_path({**candidate_env.child_env(spec, common, at_start=True),
                                                 bf16_check.ENV: "1"})
    return {"baseline": {**common, "DS_ACCELERATOR": "cpu"}, "candidate": candidate}


def checkout_version(src):
    """The text of `src`/version.txt, stripped (a byte-order mark too), or None without one; UpstreamUsageError when
    it is not UTF-8 text."""
    version_file = src / "version.txt"
    if not version_file.is_file():
        return None
    try:
        return version_file.read_text(encoding="utf-8-sig").strip()
    except UnicodeDecodeError as err:
        raise UpstreamUsageError(f"--deepspeed-src {src}: version.txt is not UTF-8 text ({err.reason} at byte "
                                 f"{err.start}); use a DeepSpeed source checkout") from None


def source_info(src):
    """{"deepspeed_src_revision": HEAD commit (+dirty) or None, "deepspeed_src_version": version.txt or None} of `src`."""
    return {"deepspeed_src_revision": environment.git_revision(src), "deepspeed_src_version": checkout_version(src)}


def _say(line):
    print(f"harness: {line}", flush=True)


def run(args):
    """`upstream`: DeepSpeed's selected tests in one pytest session per side (CPU baseline, then the candidate), judged test by
    test into report.json / junit.xml / report.md; exit status 0 or 1 (1 also when no test was judged).
    Raises UpstreamUsageError (exit 2) for a wrong checkout, selection, candidate or option."""
    src, tests_dir, spec, selection = _plan(args)
    run_id = run_dir.new_run_id("upstream", args.backend)
    out = run_dir.prepare(args.out or run_dir.reports_root() / run_id)
    parts = out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    envs = side_envs(spec, args.backend, args.devices, args.timeout)
    pytest_args = [*(["-k", args.keyword] if args.keyword else []),
                   *(["-n", str(args.workers)] if args.workers else [])]
    missing = selection.missing_files(tests_dir)
    groups = selection.sessions(missing)
    targets = [target for _, group in groups for target in group]
    _say(f"upstream: {len(targets)} target(s) from {selection.path.name}"
         + (f" (subset {selection.subset})" if selection.subset != "all" else "") + f" in {tests_dir}, "
         f"candidate {spec.text} vs DeepSpeed's CPU accelerator -> {out}")
    sides, interrupted = {}, False
    for side in SIDES:
        _say(f"upstream: {side} ({'DS_ACCELERATOR=cpu' if side == 'baseline' else spec.text})")
        sides[side] = upstream_run.run_side_sessions(name=side, tests_dir=tests_dir, groups=groups,
                                                     pytest_args=pytest_args, env=envs[side], workdir=parts,
                                                     timeout_s=args.timeout, say=_say)
        counts = upstream_verdicts.side_counts(sides[side].results)
        _say(f"upstream: {side}: {_counts_text(counts)} in {sides[side].seconds:.0f} s")
        if sides[side].interrupted:
            interrupted = True
            break
    report = _report(run_id=run_id, out=out, src=src, spec=spec, selection=selection, missing=missing,
                     sides=sides, args=args, env=envs["candidate"], complete=not interrupted and len(sides) == 2)
    latest = run_dir.point_latest(out)
    for result in report["results"]:
        if result["status"] == "failed":
            _say(f"{result['evidence']['verdict'].upper()} {result['id']}: {result['message']}")
    for entry in report["upstream"]["stale_selection"]:
        _say(f"selection entry matched no test: {entry}")
    for entry in report["expectations"]["unmatched"]:
        _say(f"known difference matched no test: {entry['id']}")
    for test_id in report["expectations"]["xpassed"]:
        _say(f"known difference now passes: {test_id}")
    verdicts = report["upstream"]["verdicts"]
    _say("upstream: " + (", ".join(f"{count} {verdict}" for verdict, count in verdicts.items() if count)
                         or "no test was judged (the selection and -k left nothing to run)")
         + ("" if report["complete"] else "; INCOMPLETE run"))
    _say(f"report: {out / 'report.md'} (report.json, junit.xml; latest: {latest})")
    judged = report["summary"]["total"] > 0
    return report_files.exit_status(report) if judged else 1


def _counts_text(counts):
    return ", ".join(f"{count} {status}" for status, count in counts.items()) or "no tests"


def _without_checkout_path(results, src):
    """Messages and tracebacks name files relative to the checkout: a report pastes without local paths."""
    prefix = f"{src}{os.sep}"
    strip = lambda text: text.replace(prefix, "") if isinstance(text, str) else text
    for result in results:
        for key in ("message", "traceback"):
            result[key] = strip(result[key])
        result["evidence"] = {key: strip(value) for key, value in result["evidence"].items()}
    return results


def _report(*, run_id, out, src, spec, selection, missing, sides, args, env, complete):
    empty = upstream_run.SideRun()
    baseline, candidate = sides.get("baseline", empty), sides.get("candidate", empty)
    # An interrupted run judges only what the candidate finished; its selection is not judged stale.
    judged = baseline.results if complete else {k: v for k, v in baseline.results.items() if k in candidate.results}
    results = _without_checkout_path(upstream_verdicts.judge_all(judged, candidate.results), src)
    unmatched = expectations.apply(results, list(selection.known))
    files = upstream_verdicts.per_file(results, selection.fp16_known)
    # Entries left out by -k, or not reached by an interrupted run, are not stale; known differences of entries a
    # subset leaves out match nothing.
    whole = complete and not args.keyword
    if not (whole and selection.subset == "all"):
        unmatched = []
    stale = missing + ([entry.label for entry in selection.stale_entries([*baseline.results, *candidate.results])
                        if entry.path not in missing] if whole else [])
    fingerprint = environment.fingerprint(args.backend, spec.text, "PJRT CPU" if args.backend == "cpu" else "TPU",
                                          args.devices, env)
    report = report_json.build(run_id=run_id, suite="upstream", results=results, session={},
                               environment={**fingerprint, **source_info(src)}, complete=complete,
                               unmatched_expectations=unmatched, artifacts={})
    report["upstream"] = {
        "selection": selection.path.name,
        "keyword": args.keyword,
        "verdicts": {verdict: sum(1 for r in results if r["evidence"]["verdict"] == verdict)
                     for verdict in upstream_verdicts.VERDICTS},
        "subset": selection.subset,
        "files": files,
        "total": upstream_verdicts.total(files),
        "stale_selection": stale,
        "sides": {name: {"seconds": round(side.seconds, 1), "sessions": side.sessions, "stopped": side.stopped,
                         "counts": upstream_verdicts.side_counts(side.results)}
                  for name, side in (("baseline", baseline), ("candidate", candidate))},
        "timeout_s": args.timeout,
        "stopped_after_s": args.timeout + upstream_run.GRACE_S,
    }
    report_files.write(report, results, out)
    return report
