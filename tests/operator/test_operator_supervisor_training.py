"""A Supervisor job training for real on the local cluster (torch, gloo, NVRx under the operator):
an exception, a SIGKILLed rank, a hang and the loss of worker 0's node are each recovered in-process
by the surviving processes, the lost indices taken over by the hot spares' reserve ranks from their
memory replicas, no step lost; the operator replaces worker 0's pod once (it stands by) and never
restarts the gang; the job succeeds."""

from __future__ import annotations

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
STEPS = 80


def _reports(kubeconfig: Path, pod: str) -> list[dict[str, str]]:
    """The recoveries a pod's trainer logged (``rtj-recovery: kind=... resumed_step=...``)."""
    out = kubectl(kubeconfig, "-n", "default", "logs", pod, check=False)
    return [
        dict(field.split("=", 1) for field in line.split()[1:] if "=" in field)
        for line in out.splitlines()
        if line.startswith("rtj-recovery:")
    ]


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
        final = wait_state(kc, "default", JOB, "Succeeded", timeout=600)
        reasons = event_reasons(kc, "default", JOB)
        recoveries = [r for pod in pods(kc, "default", JOB) for r in _reports(kc, pod)]
    assert final["progress"]["step"] == STEPS
    # The operator replaced worker 0 once (its replacement stood by) and restarted nothing else.
    assert final["restarts"]["podReplacement"] == 1, final["restarts"]
    assert [f["nodeName"] for f in final["nodeFaults"]] == [lost]
    assert events.WORKER_REPLACED in reasons and events.GANG_RESTART not in reasons, reasons
    # Every recovery in-process, none losing a step; the lost indices from their replicas.
    assert recoveries, "no recovery logged"
    assert {r["kind"] for r in recoveries} == {"InProcessRestart"}, recoveries
    assert {r["steps_lost"] for r in recoveries} == {"0"}, recoveries
    resumed = {int(r["resumed_step"]): set() for r in recoveries}
    for r in recoveries:
        resumed[int(r["resumed_step"])].add(r["from"])
    assert resumed[10] == {"memory"} and resumed[40] == {"memory"}, resumed
    assert "memory-replica" in resumed[25], resumed
    after_loss = [sources for step, sources in resumed.items() if step >= 55]
    assert after_loss and "memory-replica" in set().union(*after_loss), resumed
