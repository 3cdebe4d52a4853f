"""The GitHub workflows: valid for GitHub (check-jsonschema's schema of workflow files), free of
zizmor's security findings, and running only commands this repository has (tox envs, .ci/run)."""

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def tool(name):
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def lint(path):
    return subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)


def run_steps(workflow):
    data = yaml.safe_load(workflow.read_text())
    return [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]


def test_there_are_a_pull_request_and_two_nightly_workflows():
    assert {path.name for path in WORKFLOWS} == {"pull-request.yml", "nightly-tpu.yml", "nightly-cpu.yml"}


def test_every_conformance_check_runs_nightly_on_cpu_and_tpu():
    # the standard suite (tox -e cpu) and the pull-request job's smoke suite leave checks to the nightly
    for name, command in (("nightly-cpu.yml", "tox -e cpu -- --suite all"), ("nightly-tpu.yml", "tox -e tpu")):
        assert command in "\n".join(run_steps(REPO / ".github" / "workflows" / name)), f"{name} does not run {command}"
    tox = configparser.ConfigParser()
    tox.read(REPO / "tox.ini")
    assert "--suite all" in tox["testenv:tpu"]["commands"] and "--suite standard" in tox["testenv:cpu"]["commands"]


def test_deepspeeds_own_tests_run_whole_nightly_and_their_subset_in_pull_requests():
    nightly = "\n".join(run_steps(REPO / ".github" / "workflows" / "nightly-cpu.yml"))
    pull_request = "\n".join(run_steps(REPO / ".github" / "workflows" / "pull-request.yml"))
    assert "tox -e upstream" in nightly and "--subset" not in nightly
    assert "tox -e upstream" in pull_request and "--subset pr" in pull_request


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda path: path.name)
def test_workflow_is_valid_for_github(workflow):
    proc = lint(workflow)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_schema_check_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOWS[0].read_text().replace("runs-on:", "run-on:"))
    assert lint(broken).returncode != 0


def test_workflows_have_no_security_findings():
    proc = subprocess.run([tool("zizmor"), "--offline", "--no-progress", str(REPO / ".github" / "workflows")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_commands_the_workflows_run_exist():
    tox = configparser.ConfigParser()
    tox.read(REPO / "tox.ini")
    envs = {section.removeprefix("testenv:") for section in tox.sections() if section.startswith("testenv:")}
    for workflow in WORKFLOWS:
        for script in run_steps(workflow):
            for env in re.findall(r"tox -e (\S+)", script):
                assert env in envs, f"{workflow.name} runs tox -e {env}, which tox.ini does not define"
            for path in re.findall(r"(?:bash|python3) ((?:\.ci|scripts)/\S+)", script):
                assert (REPO / path).is_file(), f"{workflow.name} runs {path}, which does not exist"


def test_the_pull_request_job_runs_exactly_what_ci_runs():
    scripts = run_steps(REPO / ".github" / "workflows" / "pull-request.yml")
    # as root (sudo, keeping the environment and PATH): the multi-host bed needs it
    assert 'sudo -E env "PATH=$PATH" bash .ci/run' in scripts
    readme_command = "python3 -m pip install -q tox && python3 -m tox -e tests"
    assert readme_command in (REPO / "README.md").read_text() and (REPO / ".ci" / "run").read_text().rstrip().endswith(
        readme_command)


def test_no_pull_request_reaches_the_self_hosted_tpu_runners():
    nightly = yaml.safe_load((REPO / ".github" / "workflows" / "nightly-tpu.yml").read_text())
    triggers = nightly[True]  # YAML reads the key `on` as True
    assert set(triggers) == {"schedule", "workflow_dispatch"}
    assert "self-hosted" in nightly["jobs"]["tpu"]["runs-on"]
