"""A Supervisor job training for real on the local cluster (torch, gloo, NVRx under the operator):
an exception, a SIGKILLed rank, a hang and the loss of worker 0's node are each recovered in-process
by the surviving processes, the lost indices taken over by the hot spares' reserve ranks from their
memory replicas, no step lost; the operator replaces worker 0's pod once (it stands by) and never
restarts the gang; the job succeeds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from operator_cluster import apply, event_reasons, install_crd, job_manifest, job_status, pods, wait_state
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port_pair
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator import events, names
from rtj_operator.main import EmbeddedOperator

pytestmark = [
    pytest.mark.slow,
    pytest.mark.local_cluster(nodes=6, profile="cpu", node_monitor_grace_seconds=3.0),
]

JOB = "sv"
STEPS = 120  # the node is killed at step 55 or later: leave it room to recover before the end


RECOVERY = re.compile(r"rtj-recovery:((?: \w+=\S+)+)")
RESUMED = re.compile(r"rank \d+: iteration ([1-9]\d*) resumes at step (\d+) from ([\w-]+)")


def _logs(kubeconfig: Path) -> list[str]:
    """Every pod's log; empty for a pod whose container has not started (worker 0's replacement)."""
    names_ = pods(kubeconfig, "default", JOB)
    return [kubectl(kubeconfig, "-n", "default", "logs", pod, check=False) for pod in names_]


def _logs_once_replicas_resumed_after(kubeconfig: Path, step: int) -> list[str] | None:
    """Every pod's log once a rank resumed past ``step`` from a replica, else None. Read while the
    job runs: once it succeeds, the spare pods go, and their logs with them."""
    logs = _logs(kubeconfig)
    resumed = [sources for log in logs for at, sources in _resumes(log).items() if at >= step]
    return logs if resumed and "memory-replica" in set().union(*resumed) else None


def _reports(log: str) -> list[dict[str, str]]:
    """The recoveries a pod's trainer logged (``rtj-recovery: kind=... resumed_step=...``), one per
    pod and fault, from the rank holding the pod's reporting lock. Searched anywhere in a line: the
    pod's ranks share its output, and a line another process wrote in pieces may precede one."""
    return [dict(field.split("=", 1) for field in m.group(1).split()) for m in RECOVERY.finditer(log)]


def _resumes(log: str) -> dict[int, set[str]]:
    """Where each rank of a pod resumed after each fault: step -> sources (every rank logs its own,
    the reporting lock's holder or not)."""
    found: dict[int, set[str]] = {}
    for match in RESUMED.finditer(log):
        found.setdefault(int(match.group(2)), set()).add(match.group(3))
    return found


def _step(kubeconfig: Path) -> int:
    return int((job_status(kubeconfig, "default", JOB).get("progress") or {}).get("step") or 0)


def test_every_fault_class_recovered_in_process_and_worker_zeros_node_loss_is_one_replacement(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)

    faults = "exception@step=10,rank=1;sigkill@step=25,rank=2;hang@step=40,rank=3"
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = job_manifest(
            JOB,
            "default",
            nodes=2,
            command=["rtj-train"],
            args=["--steps", str(STEPS), "--step-sleep", "0.1"],
            processesPerNode=2,
            hotSpares=2,
            env=[
                {"name": "RTJ_FAULTS", "value": faults},
                {"name": "RTJ_PROGRESS_INTERVAL_SECONDS", "value": "1"},
            ],
            rendezvous={"port": reserve_port_pair()},
            checkpoint={"intervalSteps": 20},
            faultTolerance={
                "launcher": "Supervisor",
                "inProcess": {"softTimeoutSeconds": 4, "hardTimeoutSeconds": 8, "barrierTimeoutSeconds": 20},
            },
            failurePolicy={"nodeLossGraceSeconds": 3, "backoffSeconds": 1, "maxNodeReplacements": 3},
        )
        apply(kc, job, tmp_path)
        wait_for(lambda: _step(kc) >= 55, timeout=600, message="training past the hang")
        children = pods(kc, "default", JOB)
        assert len(children) == 5  # two workers, two hot spares, the store
        lost = children[names.worker_pod_name(JOB, 0)]["spec"]["nodeName"]
        local_cluster.kill_node(lost)
        logs = wait_for(
            lambda: _logs_once_replicas_resumed_after(kc, 55),
            timeout=600,
            interval=1.0,
            message="a reserve rank resuming worker 0's index from its replica",
        )
        final = wait_state(kc, "default", JOB, "Succeeded", timeout=600)
        reasons = event_reasons(kc, "default", JOB)
    recoveries = [r for log in logs for r in _reports(log)]
    resumed: dict[int, set[str]] = {}
    for log in logs:
        for step, sources in _resumes(log).items():
            resumed.setdefault(step, set()).update(sources)
    assert final["progress"]["step"] == STEPS
    # The operator replaced worker 0 once (its replacement stood by) and restarted nothing else.
    assert final["restarts"]["podReplacement"] == 1, final["restarts"]
    assert [f["nodeName"] for f in final["nodeFaults"]] == [lost]
    assert events.WORKER_REPLACED in reasons and events.GANG_RESTART not in reasons, reasons
    # Every recovery in-process, none losing a step; the lost indices from their replicas.
    assert recoveries, "no recovery logged"
    assert {r["kind"] for r in recoveries} == {"InProcessRestart"}, recoveries
    assert {r["steps_lost"] for r in recoveries} == {"0"}, recoveries
    assert resumed[10] == {"memory"} and resumed[40] == {"memory"}, resumed
    assert "memory-replica" in resumed[25], resumed
