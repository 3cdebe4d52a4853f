"""report.md: a run's report ready to paste into a pull request."""

import html
import json
from collections import Counter

from .report_json import FAILING, STATUSES
from .suites import SUITES

_MARK = {"passed": "✅", "failed": "❌", "error": "💥", "flaky": "🔀", "xfailed": "⚠️", "xpassed": "❗", "skipped": "⏭️"}


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _details(summary, body):
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>\n"


def _evidence_block(result, artifacts):
    parts = []
    if result.get("evidence"):
        parts.append("```json\n" + json.dumps(result["evidence"], indent=1, default=str)[:4000] + "\n```")
    if result["id"] in artifacts:
        parts.append(f"![loss curves]({artifacts[result['id']]})")
    if result.get("traceback"):
        parts.append("```\n" + result["traceback"] + "\n```")
    return "\n\n".join(parts)


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
             + (f", `-k {up['keyword']}`" if up["keyword"] else "")
             + f") from a DeepSpeed checkout at `{env.get('deepspeed_src_revision')}` (version.txt "
             f"{env.get('deepspeed_src_version')}), run against the installed DeepSpeed {env.get('deepspeed')}: "
             "each test on the baseline (DeepSpeed's CPU accelerator) and on the candidate.",
             "", "| verdict | tests |", "|---|---|"]
    lines += [f"| {verdict} | {count} |" for verdict, count in up["verdicts"].items() if count]
    lines += ["", "| file | tests | baseline pass/fail/skip | candidate pass/fail/skip | verdicts |", "|---|---|---|---|---|"]
    for path, row in up["files"].items():
        sides = ["/".join(str(row[side].get(o, 0)) for o in ("pass", "fail", "skip")) for side in ("baseline", "candidate")]
        verdicts = ", ".join(f"{count} {verdict}" for verdict, count in row["verdicts"].items())
        lines.append(f"| `{path}` | {row['tests']} | {sides[0]} | {sides[1]} | {verdicts} |")
    timing = "; ".join(f"{name} {side['seconds']:.0f} s in {side['sessions']} session(s)"
                       + (f", {len(side['stopped'])} test(s) stopped after {up['timeout_s']} s" if side["stopped"] else "")
                       for name, side in up["sides"].items())
    lines += ["", f"Time: {timing}."]
    if up["stale_selection"]:
        lines += ["", "Selection entries that matched no test (renamed or removed in this checkout): "
                  + ", ".join(f"`{entry}`" for entry in up["stale_selection"]) + "."]
    return lines


def render(report):
    summary, env = report["summary"], report["environment"]
    verdict = "PASS" if report["complete"] and not any(summary[s] for s in FAILING) else "FAIL"
    lines = [
        f"## DeepSpeed XLA conformance: {verdict}",
        "",
        f"candidate `{env.get('candidate')}` on `{env.get('backend')}` ({env.get('device_kind')} x"
        f"{env.get('device_count')}), suite `{report['suite']}`, run `{report['run_id']}`",
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
    lines += _reference_sources(report["results"])
    lines += _upstream_section(report)
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
            lines.append(_details(head, _evidence_block(result, artifacts) or "(no evidence recorded)"))
    unmatched = report["expectations"]["unmatched"]
    if unmatched:
        lines += [f"### Expectations that matched no test ({len(unmatched)})", ""]
        lines += [f"- `{e['id']}`: {_cell(e['reason'])} ({e['link']})" for e in unmatched] + [""]
    plotted = [r for r in report["results"] if r["id"] in artifacts and r["status"] == "passed"]
    if plotted:
        body = "\n\n".join(f"`{r['id']}`\n\n![loss curves]({artifacts[r['id']]})" for r in plotted)
        lines.append(_details(f"Loss curves ({len(plotted)})", body))
    rows = "\n".join(f"| {key} | `{_cell(value)}` |" for key, value in env.items() if key != "env")
    rows += "".join(f"\n| env {key} | `{_cell(value)}` |" for key, value in env.get("env", {}).items())
    lines.append(_details("Environment", "| | |\n|---|---|\n" + rows))
    all_results = "\n".join(f"| {_MARK[r['status']]} {r['status']} | `{r['id']}` | {r['duration_s']:.2f} |"
                            for r in report["results"])
    lines.append(_details(f"All results ({summary['total']})", "| status | id | seconds |\n|---|---|---|\n" + all_results))
    return "\n".join(lines) + "\n"


def write(report, path):
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(report))
