"""The one comparison engine for loss curves: a candidate's against a reference's, step by step,
within the tolerance table fixtures/tolerances.toml."""

import os

import tomllib

from harness.paths import TOLERANCES


def tolerance(precision, device=None):
    """(rtol, atol) for 'fp32' or 'bf16' from fixtures/tolerances.toml: the device's row of that
    precision where it has one (e.g. [fp32.tpu]), else the precision's own. `device` defaults to
    this run's PJRT_DEVICE. KeyError names the precisions the table has."""
    table = tomllib.loads(TOLERANCES.read_text())
    if precision not in table:
        raise KeyError(f"no tolerance for precision {precision!r} in {TOLERANCES}; have {sorted(table)}")
    device = (device or os.environ.get("PJRT_DEVICE", "CPU")).lower()
    row = table[precision].get(device, table[precision])
    return row["rtol"], row["atol"]


def compare_losses(reference, candidate, precision):
    """Evidence dict: ok, max abs/rel error, tolerance, first diverging step, both curves.

    A step diverges when |candidate - reference| > atol + rtol * |reference| (numpy.isclose's rule);
    curves of different lengths never match."""
    rtol, atol = tolerance(precision)
    abs_err = [abs(c - r) for r, c in zip(reference, candidate)]
    rel_err = [e / abs(r) if r else e for e, r in zip(abs_err, reference)]
    diverging = [i for i, (e, r) in enumerate(zip(abs_err, reference)) if e > atol + rtol * abs(r)]
    same_length = len(reference) == len(candidate)
    return {
        "ok": same_length and not diverging,
        "steps": len(reference),
        "candidate_steps": len(candidate),
        "max_abs_err": max(abs_err, default=0.0),
        "max_rel_err": max(rel_err, default=0.0),
        "rtol": rtol,
        "atol": atol,
        "first_diverging_step": diverging[0] if diverging else None,
        "reference": list(reference),
        "candidate": list(candidate),
    }


def describe_mismatch(evidence, what, reference="the CPU reference"):
    """One paragraph a reader understands without the test: where and by how much."""
    if evidence["steps"] != evidence["candidate_steps"]:
        return f"{what}: candidate logged {evidence['candidate_steps']} steps, reference {evidence['steps']}"
    step = evidence["first_diverging_step"]
    return (f"{what}: loss diverges from {reference} at step {step} "
            f"(reference {evidence['reference'][step]!r}, candidate {evidence['candidate'][step]!r}); "
            f"max rel err {evidence['max_rel_err']:.3g} over {evidence['steps']} steps, "
            f"tolerance rtol={evidence['rtol']:g} atol={evidence['atol']:g}")
