"""A job on hollow nodes (``rtj_localcluster.hollow``) through a node loss, end to end on the real
control plane: 50 hollow nodes in three zones, an 8-node job whose stand-in trainers report progress
as trainers do, one node lost. The node lifecycle controller judges the node from its stale Lease; the
operator files the loss, replaces the pod on another node, the world starts again from its newest
checkpoint, and the job Succeeds with every step done; the node, back, is Ready again."""

from __future__ import annotations

from pathlib import Path

import pytest
from operator_cluster import (
    apply,
    event_lines,
    event_reasons,
    install_crd,
    job_manifest,
    job_status,
    pods,
    wait_state,
)
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.hollow import STEP_SECONDS_ENV, STEPS_ENV, HollowSettings
from rtj_localcluster.testing import wait_for
from rtj_operator import constants
from rtj_operator.main import EmbeddedOperator

pytestmark = pytest.mark.slow

STEPS = 120
ZONES = ("zone-a", "zone-b", "zone-c")


def worker_nodes(kc: Path, job: str) -> dict[str, str]:
    """Worker index -> node of the job's live worker pods that are Running."""
    return {
        p["metadata"]["labels"][constants.LABEL_WORKER_INDEX]: p["spec"]["nodeName"]
        for p in pods(kc, "default", job).values()
        if p["metadata"]["labels"].get(constants.LABEL_ROLE) == constants.ROLE_WORKER
        and p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    }


@pytest.mark.local_cluster(
    nodes=0,
    profile="cpu",
    zones=ZONES,
    node_monitor_grace_seconds=6.0,
    hollow=HollowSettings(lease_interval_seconds=1.5, step_seconds=0.2),
)
def test_a_job_on_hollow_nodes_goes_through_a_node_loss_and_succeeds(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    hollow = local_cluster.hollow.add(50, profile="cpu")
    assert {local_cluster.hollow.zone_of(name) for name in hollow} == set(ZONES)
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = job_manifest(
            "hollow",
            "default",
            nodes=8,
            env=[{"name": STEPS_ENV, "value": str(STEPS)}, {"name": STEP_SECONDS_ENV, "value": "0.2"}],
            failurePolicy={"nodeLossGraceSeconds": 1, "backoffSeconds": 1},
        )
        apply(kc, job, tmp_path)
        wait_state(kc, "default", "hollow", "Running", timeout=120)
        wait_for(
            lambda: (job_status(kc, "default", "hollow").get("progress") or {}).get("step", 0) >= 30,
            timeout=60,
            message="the stand-in trainers' step to reach the job's status",
        )
        placed = worker_nodes(kc, "hollow")
        assert len(placed) == 8 and set(placed.values()) <= set(hollow)
        lost = placed["3"]
        local_cluster.hollow.lose([lost])
        wait_for(
            lambda: worker_nodes(kc, "hollow").get("3") not in (None, lost),
            timeout=90,
            message=f"worker 3 to run again on a node other than {lost}",
        )
        status = wait_state(kc, "default", "hollow", "Succeeded", timeout=180)
    reasons = event_reasons(kc, "default", "hollow")
    assert "NodeLost" in reasons, event_lines(kc, "default", "hollow")
    assert status["progress"]["step"] == STEPS
    assert status["restarts"]["podReplacement"] == 1, status["restarts"]
    assert lost in {fault["nodeName"] for fault in status.get("nodeFaults") or []}, status.get("nodeFaults")
    local_cluster.hollow.recover([lost])  # the machine is back: its Lease renewed, Ready posted again
    wait_for(
        lambda: local_cluster.node_ready_status(lost) == "True", timeout=30, message=f"{lost} Ready again"
    )
