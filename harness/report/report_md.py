"""report.md: a run's report ready to paste into a pull request.

A pull-request comment holds 65,536 characters: report.md stays under LIMIT_BYTES whatever
the run. It is rendered at the most detailed level that fits (evidence and tracebacks cut
shorter at each level, then left to report.json, then the all-results table reduced to what
did not pass). It names no path of the machine it ran on (the repository, the Python
environment, the home and temporary directories become placeholders) nor its host name, and
links loss-curve images as files of the run's artifact instead of embedding them, so a pasted
report has no broken images.
"""

import html
import json
import os
import re
import socket
import sys
import tempfile
from collections import Counter
from pathlib import Path

from harness.paths import REPO
from harness.report.report_json import FAILING, STATUSES
from harness.session.suites import SUITES

LIMIT_BYTES = 60_000
# (evidence characters, traceback characters, all results listed, details per failure) per level,
# most detailed first; the last lists each failure on one line.
LEVELS = ((2000, 3000, True, True), (800, 1200, True, True), (300, 0, True, True), (0, 0, True, True),
          (0, 0, False, True), (0, 0, False, False))

_MARK = {"passed": "✅", "failed": "❌", "error": "💥", "flaky": "🔀", "xfailed": "⚠️", "xpassed": "❗", "skipped": "⏭️"}


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _details(summary, body):
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>\n"


def _cut(text, limit, keep_end=False):
    if len(text) <= limit:
        return text
    return ("..." + text[-limit:]) if keep_end else (text[:limit] + " ...")


def _evidence_block(result, artifacts, level):
    evidence_chars, traceback_chars = level[:2]
    parts = []
    if result.get("evidence") and evidence_chars:
        parts.append("```json\n" + _cut(json.dumps(result["evidence"], indent=1, default=str), evidence_chars) + "\n```")
    if result["id"] in artifacts:
        parts.append(_curve_link(artifacts[result["id"]]))
    if result.get("traceback") and traceback_chars:
        parts.append("```\n" + _cut(result["traceback"], traceback_chars, keep_end=True) + "\n```")
    if result.get("evidence") or result.get("traceback"):
        parts.append("(complete evidence and traceback: report.json)")
    return "\n\n".join(parts)


def _curve_link(path):
    return f"Loss curves: `{path}` in the run directory (the run's artifact)."


def local_paths():
    """[(pattern, placeholder)] for every path and name of this machine a report must not show."""
    places = [(str(REPO), "<repo>"), (sys.prefix, "<python-env>"), (tempfile.gettempdir(), "<tmp>"),
              (str(Path.home()), "~")]
    places = [(os.path.realpath(path), name) for path, name in places] + places
    places = [(path.rstrip("/"), name) for path, name in places if len(path.rstrip("/")) > 1]  # never "/" itself
    places.sort(key=lambda place: -len(place[0]))  # the longest first: the repository before the home in it
    # A path only where it is one (followed by "/" or the end of a word); the host name only as a whole word.
    patterns = [(re.compile(re.escape(path) + r"(?=/|\b|$)"), name) for path, name in places]
    host = socket.gethostname()
    if len(host) > 2:
        patterns.append((re.compile(r"(?<![\w.-])" + re.escape(host) + r"(?![\w-])"), "<host>"))
    return patterns


def redact(text):
    """`text` with this machine's paths (repository, Python environment, temporary and home directories) and host name
    replaced by placeholders such as <repo> and <host> (local_paths())."""
    for pattern, placeholder in local_paths():
        text = pattern.sub(placeholder, text)
    return text


def _reference_sources(results):
    """Where the loss curves were compared from: trained live in this run, or stored (and why not, where
    a stored one was asked for and could not be used)."""
    evidence = [r["evidence"] for r in results if r.get("evidence", {}).get("reference_source")]
    if not evidence:
        return []
    counts = Counter(e["reference_source"] for e in evidence)
    parts = []
    if counts["stored"]:
        parts.append(f"{counts['stored']} stored (fixtures/references/, recorded for this torch and DeepSpeed)")
    if counts["live"]:
        parts.append(f"{counts['live']} trained live in this run")
    unused = sum(1 for e in evidence if e.get("reference_note"))
    drifts = [e["stored_max_rel_diff"] for e in evidence if e.get("stored_max_rel_diff") is not None]
    return ["", f"CPU reference curves: {', '.join(parts)}."
            + (f" {unused} stored curve(s) could not be used; each check's evidence says why." if unused else "")
            + (f" The {len(drifts)} trained here differ from their stored curves by at most {max(drifts):.2g} "
               "relative." if drifts else "")]


def _upstream_section(report):
    """DeepSpeed's own tests: where they came from, and per file the two sides and the verdicts."""
    up = report.get("upstream")
    if up is None:
        return []
    env = report["environment"]
    lines = ["", f"DeepSpeed's own unit tests (`{up['selection']}`"
             + (f", subset `{up['subset']}`" if up.get("subset", "all") != "all" else "")
             + (f", `-k {up['keyword']}`" if up["keyword"] else "")
             + f") from a DeepSpeed checkout at `{env.get('deepspeed_src_revision')}` (version.txt "
             f"{env.get('deepspeed_src_version')}), run against the installed DeepSpeed {env.get('deepspeed')}: "
             "each test on the baseline (DeepSpeed's CPU accelerator) and on the candidate.",
             "", "| verdict | tests |", "|---|---|"]
    lines += [f"| {verdict} | {count} |" for verdict, count in up["verdicts"].items() if count]
    lines += ["", "| file | collected | passed on CPU | passed on the candidate | expected | fp16 | regressions | "
              "baseline pass/fail/skip | candidate pass/fail/skip | verdicts |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [_upstream_row(f"`{path}`", row) for path, row in up["files"].items()]
    lines.append(_upstream_row("**total**", up["total"]))
    lines += ["", "Expected: known differences of the candidate, listed with their reasons and links under Expected failures; "
              "fp16: tests of fp16, which XLA devices do not compute (bf16 is their half precision), counted apart."]
    timing = "; ".join(f"{name} {side['seconds']:.0f} s in {side['sessions']} session(s)"
                       + (f", {len(side['stopped'])} stopped after {up['stopped_after_s']} s" if side["stopped"] else "")
                       for name, side in up["sides"].items())
    lines += ["", f"Time: {timing}."]
    if up["stale_selection"]:
        lines += ["", "Selection entries that matched no test (renamed or removed in this checkout): "
                  + ", ".join(f"`{entry}`" for entry in up["stale_selection"]) + "."]
    return lines


def _upstream_row(name, row):
    """One line of the per-file table: `row` is an upstream_verdicts.per_file row (or their total)."""
    sides = [[row[side].get(o, 0) for o in ("pass", "fail", "skip")] for side in ("baseline", "candidate")]
    verdicts = ", ".join(f"{count} {verdict}" for verdict, count in row["verdicts"].items())
    return (f"| {name} | {row['tests']} | {sides[0][0]} | {sides[1][0]} | {row['expected']} | {row['fp16']} | "
            f"{row['regressions']} | {'/'.join(map(str, sides[0]))} | {'/'.join(map(str, sides[1]))} | {verdicts} |")


def _performance_section(report):
    """The benchmark tables `harness bench --report` added: each as printed, and whether it met its targets."""
    tables = report.get("performance")
    if not tables:
        return []
    lines = ["", "### Performance", "",
             "Ratios measured side by side in one run (`python -m harness bench`; benchmarks/README.md says what "
             "each measures and its targets)."]
    for table in tables:
        outcome = "targets met" if table["exit"] == 0 else f"missed a target or failed (exit {table['exit']})"
        revision = table.get("revision") or ""
        when = ", ".join(filter(None, (" ".join(table.get("arguments") or ()), table.get("recorded"),
                                       revision[:12] + ("+dirty" if revision.endswith("+dirty") else ""))))
        body = _cut(table["output"].rstrip(), 8000, keep_end=True)
        lines += ["", f"`{table['benchmark']}`" + (f" ({when})" if when else "") + f": {outcome}", "", "```", body,
                  "```"]
    return lines


def _left_out_section(report):
    """The checks the suite left out, by reason: ids where a reason covers a few, else their count."""
    by_reason = {}
    for entry in report.get("left_out", ()):
        by_reason.setdefault(entry["reason"], []).append(entry["id"])
    if not by_reason:
        return []
    lines = ["", f"Left out by suite `{report['suite']}` ({sum(map(len, by_reason.values()))} checks; `--suite all` "
             "runs every check):"]
    for reason, ids in by_reason.items():
        named = ", ".join(f"`{nodeid.rsplit('::', 1)[-1]}`" for nodeid in ids) if len(ids) <= 4 else f"{len(ids)} checks"
        lines.append(f"- {_cell(reason)}: {named}")
    return lines


def render(report, level=LEVELS[0]):
    """report.md's Markdown for `report` (a report.json dict) at one of LEVELS (evidence/traceback characters, all results
    listed, details per failure), redacted; no size limit: render_within_limit() keeps it under LIMIT_BYTES."""
    summary, env = report["summary"], report["environment"]
    verdict = "PASS" if report["complete"] and not any(summary[s] for s in FAILING) else "FAIL"
    lines = [
        f"## DeepSpeed XLA conformance: {verdict}",
        "",
        f"candidate `{env.get('candidate')}` on `{env.get('backend')}` ({env.get('device_kind')} x"
        f"{env.get('device_count')}), suite `{report['suite']}`, run `{report['run_id']}`",
        "",
        f"DeepSpeed {env.get('deepspeed')}" + (f" at `{env['deepspeed_git']}`" if env.get("deepspeed_git") else "")
        + f", torch {env.get('torch')}, torch_xla {env.get('torch_xla')}; collectives: "
        f"{env.get('collective_transport', 'not recorded')}",
        "",
    ]
    if not report["complete"]:
        lines += ["> **Incomplete run**: interrupted or a check process died; results below are partial.", ""]
    lines += ["| area | " + " | ".join(STATUSES) + " | total |", "|---" * (len(STATUSES) + 2) + "|"]
    for area, counts in report["areas"].items():
        lines.append(f"| {area} | " + " | ".join(str(counts[s]) for s in STATUSES) + f" | {counts['total']} |")
    lines.append("| **all** | " + " | ".join(f"**{summary[s]}**" for s in STATUSES) + f" | **{summary['total']}** |")
    # An area the suite names but no check ran in (no module yet, or deselected) must not read as a pass.
    unrun = [area for area in SUITES.get(report["suite"], ()) if area not in report["areas"]]
    if unrun:
        lines += ["", f"No check ran in: {', '.join(f'`{area}`' for area in unrun)}."]
    lines += _left_out_section(report)
    lines += _reference_sources(report["results"])
    lines += _upstream_section(report)
    lines += _performance_section(report)
    coverage = report["coverage"]["interface"]
    if "upstream" in report:
        lines.append("")
    elif "interface" in SUITES.get(report["suite"], ("interface", )):
        lines += ["", f"Interface coverage: {coverage['checked']}/{coverage['total']} DeepSpeedAccelerator methods "
                  "checked" + (f"; unchecked: {', '.join(f'`{m}`' for m in coverage['unchecked'])}"
                               if coverage["unchecked"] else ""), ""]
    else:  # other suites check no interface method by design; listing all as unchecked would only be noise
        lines += ["", f"Interface coverage: not measured (suite `{report['suite']}` does not run the interface area)", ""]

    artifacts = report.get("artifacts", {})
    for status, title in (("failed", "Failures"), ("error", "Errors (crashed, timed out or could not be set up)"),
                          ("flaky", "Flaky (status changed between repeated runs)"),
                          ("xpassed", "Expected failures that passed"),
                          ("xfailed", "Expected failures")):
        selected = [r for r in report["results"] if r["status"] == status]
        if not selected:
            continue
        lines += [f"### {title} ({len(selected)})", ""]
        for result in selected:
            first_line = result["message"].splitlines()[0] if result["message"] else status
            head = f"{_MARK[status]} <code>{html.escape(result['id'])}</code>: {html.escape(first_line)}"
            if result.get("expectation"):
                expectation = result["expectation"]
                head += f" (expected: {html.escape(expectation['reason'])}, {html.escape(expectation['link'])})"
            if level[3]:
                lines.append(_details(head, _evidence_block(result, artifacts, level) or "(no evidence recorded)"))
            else:
                lines.append(f"- {_cut(head, 300)}")
        if not level[3]:
            lines.append("")
    unmatched = report["expectations"]["unmatched"]
    if unmatched:
        lines += [f"### Expectations that matched no test ({len(unmatched)})", ""]
        lines += [f"- `{e['id']}`: {_cell(e['reason'])} ({e['link']})" for e in unmatched] + [""]
    plotted = [r for r in report["results"] if r["id"] in artifacts and r["status"] == "passed"]
    if plotted:
        body = "\n".join(f"- `{r['id']}`: `{artifacts[r['id']]}`" for r in plotted)
        lines.append(_details(f"Loss curves ({len(plotted)} PNGs in the run directory, the run's artifact)", body))
    rows = "\n".join(f"| {key} | `{_cell(value)}` |" for key, value in env.items() if key != "env")
    rows += "".join(f"\n| env {key} | `{_cell(value)}` |" for key, value in env.get("env", {}).items())
    lines.append(_details("Environment", "| | |\n|---|---|\n" + rows))
    listed = [r for r in report["results"] if level[2] or r["status"] != "passed"]
    title = (f"All results ({summary['total']})" if level[2] else
             f"Results other than passed ({len(listed)} of {summary['total']}; all of them: report.json)")
    verdict_column = "upstream" in report
    all_results = "\n".join(f"| {_MARK[r['status']]} {r['status']} | "
                            + (f"{r['evidence'].get('verdict', '')} | " if verdict_column else "")
                            + f"`{r['id']}` | {r['duration_s']:.2f} |" for r in listed)
    header = "| status | verdict | id | seconds |\n|---|---|---|---|\n" if verdict_column else \
        "| status | id | seconds |\n|---|---|---|\n"
    lines.append(_details(title, header + all_results))
    return redact("\n".join(lines) + "\n")


def render_within_limit(report, limit=LIMIT_BYTES):
    """The most detailed rendering under `limit` bytes (UTF-8); cut at the limit, saying so, if none is."""
    for level in LEVELS:
        text = render(report, level)
        if len(text.encode("utf-8")) <= limit:
            return text
    note = "\n\n> report.md cut at its size limit; the complete report is report.json.\n"
    return text.encode("utf-8")[:limit - len(note.encode())].decode("utf-8", "ignore") + note

