"""The multi-process suites through the harness, as a user runs them: deepspeed_xla starts
under DeepSpeed's launcher without the parent touching the XLA runtime, passes every
collective at 2 and 4 ranks, matches the CPU reference at every ZeRO stage and precision and
in the pipeline engine, its checkpoints move to and from CPU, and it stops compiling after
warm-up. Candidates with a real defect are caught where it shows: a device_count that
starts the runtime by the launcher suite, a backend whose AVG is a SUM by the collectives, a
wrong optimizer path by the loss curves, a recompiling optimizer by the graph suite."""

import pytest

from test_harness_candidates import CANDIDATES, failed_ids, run_harness

ZERO_CASES = {
    *(f"zero{stage}-{precision}-{ranks}rank" for ranks in (1, 2) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")),
    "zero2-fp32-2rank-accum2-activation-checkpointing",
}

# the collectives fixture's cases that reduce with ReduceOp.AVG over more than one rank
AVG_CASES = ("all_reduce_avg", "all_reduce_strided_view", "reduce_to_root", "reduce_scatter_tensor")


def _passed_cases(report):
    return {r["id"].rsplit("[", 1)[-1].rstrip("]") for r in report["results"] if r["status"] == "passed"}


def test_reference_candidate_passes_launcher_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "launcher")
    assert report is not None, stderr
    assert status == 0 and report["summary"]["passed"] == 3, f"deepspeed_xla: failed {sorted(failed_ids(report))}"


def test_device_count_that_starts_the_runtime_fails_the_runner_parent_checks(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "launcher", "--candidate",
                                         f"{CANDIDATES}/device_count_starts_runtime.py:DeviceCountStartsRuntime")
    assert report is not None, stderr
    expected = {f"test_launcher.py::test_device_count__runner_parent_leaves_runtime_uninitialised[num_gpus-{n}]"
                for n in (2, 4)}
    assert status == 1 and failed_ids(report) == expected, f"exit {status}, failed {sorted(failed_ids(report))}"


def test_reference_candidate_passes_collectives_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "collectives")
    assert report is not None, stderr
    assert status == 0 and report["summary"]["failed"] == 0, f"deepspeed_xla: failed {sorted(failed_ids(report))}"
    cases = _passed_cases(report)
    assert {case.rsplit("-", 1)[1] for case in cases} == {"2ranks", "4ranks"} and len(cases) >= 2 * 25, sorted(cases)


def test_avg_as_sum_backend_fails_exactly_the_avg_collectives(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "collectives", "--candidate",
                                         f"{CANDIDATES}/avg_as_sum.py:AvgAsSum", "--", "-k", "2ranks")
    assert report is not None, stderr
    expected = {f"test_collectives.py::test_collective[{case}-2ranks]" for case in AVG_CASES}
    assert status == 1 and failed_ids(report) == expected, f"exit {status}, failed {sorted(failed_ids(report))}"


@pytest.mark.timeout(2400)  # 17 cases, each trained twice: about 10 minutes on 2 idle cores
def test_reference_candidate_passes_zero_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "zero")
    assert report is not None, stderr
    assert status == 0 and _passed_cases(report) == ZERO_CASES, (
        f"deepspeed_xla: passed {sorted(_passed_cases(report))}; failed {sorted(failed_ids(report))}")
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


@pytest.mark.timeout(1800)  # 3 cases, each trained twice through the launcher (2 and 4 ranks)
def test_reference_candidate_passes_pipeline_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "pipeline")
    assert report is not None, stderr
    expected = {"2stages-2ranks", "2stages-x2dp-4ranks", "2stages-2ranks-activation-checkpointing"}
    assert status == 0 and _passed_cases(report) == expected, (
        f"deepspeed_xla: passed {sorted(_passed_cases(report))}; failed {sorted(failed_ids(report))}")
    assert all(r["evidence"]["max_rel_err"] <= r["evidence"]["rtol"] for r in report["results"])


@pytest.mark.timeout(1800)  # 4 saving runs and 6 resumed runs on 2 ranks
def test_reference_candidate_passes_checkpoint_suite(tmp_path):
    status, report, stderr = run_harness(tmp_path, "--suite", "checkpoint")
    assert report is not None, stderr
    expected = {f"{direction}-zero{stage}" for stage in (2, 3)
                for direction in ("candidate-to-candidate", "candidate-to-cpu", "cpu-to-candidate")}
    assert status == 0 and _passed_cases(report) == expected, (
        f"deepspeed_xla: passed {sorted(_passed_cases(report))}; failed {sorted(failed_ids(report))}")


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
