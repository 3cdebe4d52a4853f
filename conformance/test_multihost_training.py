"""Training over several hosts: DeepSpeed's multi-node runner with the candidate gives the losses of the same
run on one host, and of DeepSpeed's CPU accelerator.

`DS_ACCELERATOR=xla deepspeed --hostfile H --master_addr host0 SCRIPT` as a pod user runs it, from host 0 of a
bed of 2 hosts on this machine (harness/multihost.py: a network namespace, hostname, /etc/hosts and sshd per
host; DeepSpeed's default pdsh runner over ssh), 2 ranks per host. The cases are the `multihost` table of
fixtures/training_cases.toml (ZeRO-3; a pipeline of 2 stages x 2 data parallel, whose stages sit on different
hosts). Ranks on different hosts reach each other only through their hosts' addresses, so a rank that binds or
resolves the wrong address fails here as on a pod. After the launcher ends no process may be left on any host.
"""

import dataclasses

import pytest
from conformance_helpers import training_case_params

from harness import multihost

pytestmark = [pytest.mark.area("multihost"),
              pytest.mark.skipif(multihost.unavailable() is not None, reason=str(multihost.unavailable()))]


@pytest.mark.parametrize("case", training_case_params("multihost"))
def test_hostfile_training_matches_one_host_and_cpu_reference(case, candidate, trains_like_reference, evidence,
                                                              tmp_path):
    what = f"{case.id}: {case.ranks} ranks over {case.hosts} hosts"
    run = trains_like_reference(case, what)
    evidence.update(left_behind=run.left_behind)
    assert not run.left_behind, f"{what}: the launcher ended, and processes were left on hosts: {run.left_behind}"
    one_host = dataclasses.replace(case, hosts=1).run(candidate, tmp_path / "one-host")
    evidence.update(one_host_losses=one_host.losses, hosts_losses=run.losses)
    differ = [step for step, (a, b) in enumerate(zip(run.losses, one_host.losses)) if a != b]
    assert len(run.losses) == len(one_host.losses) and not differ, (
        f"{what}: losses {run.losses} differ from the same {case.ranks} ranks on one host {one_host.losses}"
        + (f", first at step {differ[0]}" if differ else "") + " (the same graphs and reduction order: they are equal)")
