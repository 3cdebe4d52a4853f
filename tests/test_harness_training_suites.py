"""The training suites through the harness: deepspeed_xla matches the CPU reference at every
ZeRO stage and precision and stops compiling after warm-up; accelerators with a wrong
optimizer path are caught by their loss curves, one that recompiles every step by the
graph suite."""

import pytest

from test_harness_candidates import CANDIDATES, failed_ids, run_harness

ZERO_CASES = {
    *(f"zero{stage}-{precision}-{ranks}rank" for ranks in (1, 2) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")),
    "zero2-fp32-2rank-accum2-activation-checkpointing",
}


@pytest.mark.timeout(2400)  # 17 cases, each trained twice: about 10 minutes on 2 idle cores
def test_reference_candidate_passes_zero_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "zero")
    assert report is not None, stderr
    passed = {r["id"].rsplit("[", 1)[-1].rstrip("]") for r in report["results"] if r["status"] == "passed"}
    assert status == 0 and passed == ZERO_CASES, (
        f"deepspeed_xla: passed {sorted(passed)}; failed {sorted(failed_ids(report))}")
    curves = [r["evidence"] for r in report["results"] if r["evidence"].get("reference")]
    assert len(curves) == len(ZERO_CASES) and all(e["max_rel_err"] <= e["rtol"] for e in curves)


@pytest.mark.parametrize("candidate,case", [("cpu_op_builders.py:CpuOpBuilders", "zero0-fp32-1rank"),
                                            ("l2_adam.py:L2Adam", "zero2-fp32-2rank")],
                         ids=["cpu-op-builders", "l2-adam"])
def test_wrong_optimizer_path_fails_zero_suite(tmp_path, candidate, case):
    status, report, stderr = run_harness(tmp_path, "--suite", "zero", "--candidate", f"{CANDIDATES}/{candidate}",
                                         "--", "-k", f"{case} and not accum")
    assert report is not None, stderr
    assert status == 1 and failed_ids(report) == {
        f"test_zero_equivalence.py::test_zero_stage_loss_matches_cpu_reference[{case}]"}, (
            f"{candidate}: exit {status}, failed {sorted(failed_ids(report))}")


def test_reference_candidate_passes_graph_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "graph")
    assert report is not None, stderr
    assert status == 0 and report["summary"]["passed"] == 5, f"deepspeed_xla: failed {sorted(failed_ids(report))}"


def test_recompiling_candidate_fails_graph_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "graph", "--candidate",
                                         f"{CANDIDATES}/step_shaped_adam.py:StepShapedAdam", "--", "-k", "zero2")
    assert report is not None, stderr
    expected = {f"test_graph_recompilation.py::test_training_step_stops_compiling_after_warmup[{config}]"
                for config in ("zero2", "zero2_bf16")}
    assert status == 1 and failed_ids(report) == expected, f"exit {status}, failed {sorted(failed_ids(report))}"
