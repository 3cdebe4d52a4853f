"""The ZeRO equivalence suite through the harness: deepspeed_xla matches the CPU reference at
every stage and precision, and accelerators with a wrong optimizer path are caught by
their loss curves."""

import pytest

from test_harness_candidates import CANDIDATES, failed_ids, run_harness

ZERO_CASES = [f"zero{stage}-{precision}" for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")]


def test_reference_candidate_passes_zero_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "zero")
    assert report is not None, stderr
    passed = {r["id"].rsplit("[", 1)[-1].rstrip("]") for r in report["results"] if r["status"] == "passed"}
    assert status == 0 and passed == set(ZERO_CASES), (
        f"deepspeed_xla: passed {sorted(passed)}; failed {sorted(failed_ids(report))}")
    curves = [r["evidence"] for r in report["results"] if r["evidence"].get("reference")]
    assert len(curves) == len(ZERO_CASES) and all(e["max_rel_err"] <= e["rtol"] for e in curves)


@pytest.mark.parametrize("candidate,case", [("cpu_op_builders.py:CpuOpBuilders", "zero0-fp32"),
                                            ("l2_adam.py:L2Adam", "zero2-fp32")],
                         ids=["cpu-op-builders", "l2-adam"])
def test_wrong_optimizer_path_fails_zero_suite(tmp_path, candidate, case):
    status, report, stderr = run_harness(tmp_path, "--suite", "zero", "--candidate", f"{CANDIDATES}/{candidate}",
                                         "--", "-k", case)
    assert report is not None, stderr
    assert status == 1 and failed_ids(report) == {
        f"test_zero_equivalence.py::test_zero_stage_loss_matches_cpu_reference[{case}]"}, (
            f"{candidate}: exit {status}, failed {sorted(failed_ids(report))}")
