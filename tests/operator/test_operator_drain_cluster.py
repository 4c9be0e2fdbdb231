"""A drain through the operator on the local cluster: a worker pod deleted with its grace period in
the middle of real training (2 pods x 1 rank, ft_launcher, the checkpoint volume) commits a checkpoint
of the step it was at before it goes; the operator replaces it, and the job resumes from that step
without losing one, then finishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from operator_cluster import apply, install_crd, job_manifest, job_status, new_namespace, wait_state
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator.main import EmbeddedOperator
from rtj_trainer import checkpoint, progress

pytestmark = pytest.mark.slow

STEPS = 60


def checkpoint_dir(kubeconfig: Path, namespace: str, job: str) -> Path:
    pvc = json.loads(kubectl(kubeconfig, "get", "pvc", f"{job}-checkpoints", "-n", namespace, "-o", "json"))
    pv = json.loads(kubectl(kubeconfig, "get", "pv", pvc["spec"]["volumeName"], "-o", "json"))
    return Path(pv["spec"]["hostPath"]["path"]) / job


@pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=3.0)
def test_a_deleted_worker_commits_its_step_and_the_replacement_resumes_there(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    manifest: dict[str, Any] = job_manifest(
        "drain",
        namespace,
        nodes=2,
        command=["rtj-train"],
        args=["--steps", str(STEPS), "--step-sleep", "0.3", "--hidden", "32", "--layers", "1"],
        processesPerNode=1,
        # No periodic checkpoint before the end: the only one in the middle is the drain's.
        checkpoint={"intervalSteps": 1000},
        env=[{"name": "RTJ_PROGRESS_INTERVAL_SECONDS", "value": "1"}],
        terminationGracePeriodSeconds=120,
    )
    with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
        apply(kubeconfig, manifest, tmp_path)
        wait_for(
            lambda: (job_status(kubeconfig, namespace, "drain").get("progress") or {}).get("step", 0) >= 8,
            timeout=300,
            interval=1,
            message="training to pass step 8",
        )
        # As a node drain evicts it: a delete with the pod's grace period (120 s).
        kubectl(kubeconfig, "delete", "pod", "drain-worker-1", "-n", namespace, "--wait=false")
        wait_state(kubeconfig, namespace, "drain", "Succeeded", timeout=600)
    directory = checkpoint_dir(kubeconfig, namespace, "drain")
    committed = sorted(c.step for c in checkpoint.list_checkpoints(directory) if c.committed)
    assert committed[-1] == STEPS and len(committed) == 2, committed
    drain_step = committed[0]
    for node in (0, 1):
        state = json.loads(progress.node_state_path(directory, node).read_text())
        assert state["finished"] is True and state["step"] == STEPS
        recovery = state["events"][-1]
        assert (recovery["step"], recovery["resumedFrom"], recovery["stepsLost"]) == (
            drain_step,
            "checkpoint",
            0,
        ), state["events"]
