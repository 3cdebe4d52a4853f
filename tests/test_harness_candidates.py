"""The harness against real candidates on PJRT CPU: the reference implementation passes the whole
interface suite with nothing unchecked, and each deliberately broken candidate under
tests/candidates/ fails on exactly the checks for the method it breaks."""


import pytest
from helpers import CANDIDATES, failed_ids, failures, run_harness

# candidate file:class -> the checks that must fail, and nothing else
BROKEN = {
    "cpu_rng_state.py:CpuRngState": {
        "test_interface_rng.py::test_get_rng_state",
        "test_interface_rng.py::test_set_rng_state[None]",
        "test_interface_rng.py::test_set_rng_state[int]",
        "test_interface_rng.py::test_set_rng_state[str]",
        "test_interface_rng.py::test_set_rng_state[device]",
        "test_interface_rng.py::test_default_generator[int]",
        "test_interface_rng.py::test_default_generator[str]",
        "test_interface_rng.py::test_default_generator[device]",
        "test_interface_rng.py::test_get_rng_state__deepspeed_rng_tracker",
        "test_interface_rng.py::test_lazy_call",
    },
    "device_count_starts_runtime.py:DeviceCountStartsRuntime": {"test_interface_device.py::test_device_count"},
    # each method is probed in a process of its own: after device_count() in the same one, this would pass
    "available_after_count.py:AvailableAfterCount": {"test_interface_device.py::test_is_available"},
    "wrong_on_accelerator.py:WrongOnAccelerator": {"test_interface_device.py::test_on_accelerator"},
    "synchronize_noop.py:SynchronizeNoop": {
        f"test_interface_device.py::test_synchronize[{form}]" for form in ("None", "int", "str", "device")
    },
    "peak_below_current.py:PeakBelowCurrent": {
        "test_interface_memory.py::test_peak_at_least_current[max_memory_allocated]",
        "test_interface_memory.py::test_reset_brings_the_peak_down[reset_max_memory_allocated]",
        "test_interface_memory.py::test_reset_brings_the_peak_down[reset_peak_memory_stats]",
    },
    "device_name_ignores_local_rank.py:DeviceNameIgnoresLocalRank": {
        f"test_interface_device.py::test_device_name[rank1-{form}]" for form in ("int", "str", "device")
    },
    "loses_parameter_identity.py:LosesParameterIdentity": {
        "test_interface_device.py::test_device_name__module_move_keeps_parameter_identity"},
    "cpu_tensor_types.py:CpuFloatTensor": {"test_interface_tensors.py::test_tensor_type[FloatTensor]"},
    "l2_adam.py:L2Adam": {
        "test_interface_op_builders.py::test_create_op_builder",
        "test_interface_op_builders.py::test_create_op_builder__fused_adam_optimizer",
    },
}


@pytest.mark.slow
def test_reference_candidate_passes_interface_suite(tmp_path):
    """Three times over: a check whose answer changes between runs is flaky, and fails the run."""
    status, report, stderr = run_harness(tmp_path, "--suite", "interface", "--repeat", "3")
    assert status == 0, f"deepspeed_xla failed:{failures(report) if report else stderr}"
    assert report["repeat"] == 3 and report["summary"]["flaky"] == 0
    assert report["complete"] and report["summary"]["failed"] == 0 and report["summary"]["passed"] > 0
    assert report["coverage"]["interface"]["unchecked"] == []
    assert report["coverage"]["interface"]["total"] >= 65  # abstract methods plus the hooks DeepSpeed defines
    assert report["environment"]["accelerator_class"] == "deepspeed_xla.accelerator.XLA_Accelerator"
    assert (tmp_path / "reports" / "latest" / "report.json").is_file()


@pytest.mark.parametrize("candidate", sorted(BROKEN))
def test_broken_candidate_fails_on_its_checks(tmp_path, candidate):
    status, report, stderr = run_harness(tmp_path, "--suite", "interface", "--candidate", f"{CANDIDATES}/{candidate}")
    assert report is not None, stderr
    assert status == 1
    assert report["complete"], "the run against a broken candidate must still complete"
    assert failed_ids(report) == BROKEN[candidate]
    assert report["coverage"]["interface"]["unchecked"] == []


def test_candidate_that_fails_to_construct_is_a_failed_run(tmp_path):
    status, report, _ = run_harness(tmp_path, "--suite", "interface", "--candidate",
                                    f"{CANDIDATES}/fails_to_construct.py:FailsToConstruct")
    assert status == 1
    [result] = report["results"]
    assert result["id"] == "candidate" and result["status"] == "error"
    assert "RuntimeError: no XLA device configured for this candidate" in result["message"]
    assert "Traceback" not in result["message"]


def test_candidate_that_fails_to_import_is_a_failed_run(tmp_path):
    status, report, _ = run_harness(tmp_path, "--suite", "interface", "--candidate", "no_such_module_xyz:Accel")
    assert status == 1
    [result] = report["results"]
    assert result["message"] == ("cannot import candidate no_such_module_xyz:Accel: ModuleNotFoundError: "
                                 "No module named 'no_such_module_xyz'")


def test_expectations_turn_failures_into_xfails_and_report_stale_entries(tmp_path):
    expectations = tmp_path / "expected.toml"
    expectations.write_text("""
[[expected_failure]]
id = "conformance/test_interface_device.py::test_synchronize[*]"
reason = "synchronize is a no-op in this candidate"
link = "https://example.org/issues/1"

[[expected_failure]]
id = "conformance/test_interface_device.py::test_on_accelerator"
reason = "claimed broken, but it passes"
link = "https://example.org/issues/2"

[[expected_failure]]
id = "conformance/test_interface_device.py::test_removed_check"
reason = "a check that no longer exists"
link = "https://example.org/issues/3"
""")
    status, report, _ = run_harness(tmp_path, "--suite", "interface", "--candidate",
                                    f"{CANDIDATES}/synchronize_noop.py:SynchronizeNoop",
                                    "--expectations", str(expectations))
    assert status == 0, "failures that are all expected must not fail the run"
    assert report["summary"]["xfailed"] == 4 and report["summary"]["failed"] == 0
    assert report["expectations"]["xpassed"] == ["conformance/test_interface_device.py::test_on_accelerator"]
    assert [e["id"] for e in report["expectations"]["unmatched"]] == [
        "conformance/test_interface_device.py::test_removed_check"]
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "Expected failures that passed" in markdown and "test_removed_check" in markdown


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_crashing_check_is_an_error_and_every_other_check_still_runs(tmp_path, workers):
    """With workers, the crash takes its pytest-xdist worker down: the run goes on without it."""
    status, report, stderr = run_harness(tmp_path, "--suite", "interface", "--workers", workers, "--candidate",
                                         f"{CANDIDATES}/crashes_in_create_op_builder.py:CrashesInCreateOpBuilder")
    assert report is not None, stderr
    assert status == 1 and report["complete"], "a crash in one check must not end the run"
    [crashed] = [r for r in report["results"] if r["status"] == "error"]
    assert crashed["id"] == "conformance/test_interface_op_builders.py::test_create_op_builder"
    assert "ended (signal 6 (SIGABRT)) before the check finished" in crashed["message"]
    assert crashed["method"] == "create_op_builder"
    assert report["summary"]["failed"] == 0 and report["summary"]["passed"] > 100
    assert report["coverage"]["interface"]["unchecked"] == []
