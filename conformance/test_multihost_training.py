"""Training over several hosts: DeepSpeed's multi-node runner with the candidate gives the losses of the same
run on one host, and of DeepSpeed's CPU accelerator.

`DS_ACCELERATOR=xla deepspeed --hostfile H --master_addr host0 SCRIPT` as a pod user runs it, from host 0 of a
bed of 2 hosts on this machine (harness/multihost.py: a network namespace, hostname, /etc/hosts and sshd per
host; DeepSpeed's default pdsh runner over ssh), 2 ranks per host. The cases are the `multihost` table of
fixtures/training_cases.toml (ZeRO-3; a pipeline of 2 stages x 2 data parallel, whose stages sit on different
hosts; ZeRO-3 with ZeRO++'s quantized gradients). Ranks on different hosts reach each other only through their
hosts' addresses, so a rank that binds or resolves the wrong address fails here as on a pod. After the launcher
ends no process may be left on any host.

Quantized gradients (qgZ) are what DeepSpeed does differently between hosts: it quantizes them only across nodes,
counting world size / device_count() of them, so they are compared with the same training unquantized (DeepSpeed's
CPU accelerator has no quantizer) within their tolerance row, and the run must say it reduced them quantized; an
accelerator whose device_count() counted the whole world's devices would make 2 hosts one node, and reduce them
unquantized.
"""

import dataclasses

import pytest
from conformance_helpers import training_case_params

from harness import multihost

pytestmark = [pytest.mark.area("multihost"),
              pytest.mark.skipif(multihost.unavailable() is not None, reason=str(multihost.unavailable()))]


def _quantizes_gradients(case):
    return bool(case.area_fields.get("quantized_gradients"))


def _trains_over_hosts(case, trains_like_reference, evidence):
    what = f"{case.id}: {case.ranks} ranks over {case.hosts} hosts"
    run = trains_like_reference(case, what)
    evidence.update(left_behind=run.left_behind)
    assert not run.left_behind, f"{what}: the launcher ended, and processes were left on hosts: {run.left_behind}"
    return what, run


@pytest.mark.parametrize("case", training_case_params("multihost", lambda case: not _quantizes_gradients(case)))
def test_hostfile_training_matches_one_host_and_cpu_reference(case, candidate, trains_like_reference, evidence,
                                                              tmp_path):
    what, run = _trains_over_hosts(case, trains_like_reference, evidence)
    one_host = dataclasses.replace(case, hosts=1).run(candidate, tmp_path / "one-host")
    evidence.update(one_host_losses=one_host.losses, hosts_losses=run.losses)
    differ = [step for step, (a, b) in enumerate(zip(run.losses, one_host.losses)) if a != b]
    assert len(run.losses) == len(one_host.losses) and not differ, (
        f"{what}: losses {run.losses} differ from the same {case.ranks} ranks on one host {one_host.losses}"
        + (f", first at step {differ[0]}" if differ else "") + " (the same graphs and reduction order: they are equal)")


@pytest.mark.parametrize("case", training_case_params("multihost", _quantizes_gradients))
def test_quantized_gradients_between_hosts_match_unquantized_reference(case, trains_like_reference, evidence):
    what, run = _trains_over_hosts(case, trains_like_reference, evidence)
    quantized = run.reported.get("quantized_gradients")
    evidence.update(quantized_gradients=quantized)
    assert quantized is True, (
        f"{what}: DeepSpeed reduced the gradients unquantized (reported {quantized!r}); it quantizes them between "
        "nodes, world size / device_count() of them, so device_count() must count one host's devices, and the "
        "comparison with the unquantized reference shows nothing of ZeRO++'s quantized gradients")
