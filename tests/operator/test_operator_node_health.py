"""Node health beyond Ready, against the local cluster's real API server: a node that stays Ready but
shows a health signal (a GPU-unhealthy condition, HyperPod's health label, fewer allocatable GPUs)
has its worker replaced on another node and is recorded in status.nodeFaults; the job still
ends Succeeded.

One cluster (3 simulated p5.48xlarge nodes) serves every case: each case runs its job in a namespace
of its own and heals the node it degraded. The workers wait for a file the test writes, so the job
ends when the test says, not after a guessed time.

Only the signal may move a worker here. The simulated nodes' kubelets share one event loop in the
test's process; on a busy machine they can all miss heartbeats for a few seconds (killing the
ended pod's processes scans every process of the machine), and the control plane then reports
every node Unknown. With the 2 s `nodeLossGraceSeconds` of the other cluster tests the operator
rightly replaces the workers there too (`NodeLost` "Ready=Unknown"; worker 0's is a gang restart that
can put worker 1 where worker 0 was). Node losses are other tests' subject: this job's grace outlasts
the case.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from operator_cluster import (
    apply,
    event_reasons,
    install_crd,
    job_manifest,
    job_status,
    new_namespace,
    running_pods_on,
    wait_state,
)
from rtj_localcluster.cluster import LocalCluster, LocalClusterSettings
from rtj_localcluster.testing import DEFAULT_TEST_SETTINGS, REAL_CLUSTER_ENV, kubectl, wait_for
from rtj_operator import events, nodehealth
from rtj_operator.main import EmbeddedOperator

pytestmark = pytest.mark.slow

HEALTH_LABEL = nodehealth.HYPERPOD_HEALTH_LABEL
# Longer than a whole case: no heartbeat gap makes a node lost while it runs (see the docstring).
NODE_LOSS_GRACE_SECONDS = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if os.environ.get(REAL_CLUSTER_ENV):
        pytest.skip(f"degrades simulated nodes: needs the embedded local cluster ({REAL_CLUSTER_ENV} is set)")
    settings = {**DEFAULT_TEST_SETTINGS, "nodes": 3, "profile": "p5.48xlarge"}
    local = LocalCluster(LocalClusterSettings(state_dir=tmp_path_factory.mktemp("health"), **settings))
    local.start()
    try:
        install_crd(local.kubeconfig_path)
        yield local
    finally:
        local.stop()


@dataclass(frozen=True)
class Signal:
    """One way a Ready node turns unhealthy: how to cause it, how to undo it, what status records."""

    name: str
    cause: Callable[[LocalCluster, str], None]
    heal: Callable[[LocalCluster, str], None]
    reason: str  # status.nodeFaults[].lastReason
    permanent: bool  # excluded at once (nodehealth.DEFAULT_PERMANENT)


def _kubectl(cluster: LocalCluster, *args: str) -> None:
    kubectl(cluster.kubeconfig_path, *args)


SIGNALS = [
    Signal(
        "gpu-condition",
        lambda c, node: c.degrade_node(
            node,
            conditions=[
                {
                    "type": "AcceleratedHardwareReady",
                    "status": "False",
                    "reason": "NvidiaXID79Error",
                    "message": "GPU has fallen off the bus",
                }
            ],
        ),
        lambda c, node: c.heal_node(node),
        "AcceleratedHardwareReady",
        True,
    ),
    Signal(
        "health-label",
        lambda c, node: _kubectl(c, "label", "node", node, f"{HEALTH_LABEL}=UnschedulablePendingReboot"),
        lambda c, node: _kubectl(c, "label", "node", node, f"{HEALTH_LABEL}-"),
        "UnschedulablePendingReboot",
        False,
    ),
    Signal(
        "fewer-gpus",
        lambda c, node: c.degrade_node(node, allocatable={"nvidia.com/gpu": "7"}),
        lambda c, node: c.heal_node(node),
        nodehealth.SIGNAL_INSUFFICIENT_ALLOCATABLE,
        True,
    ),
]


def _wait_for_file(path: Path) -> list[str]:
    script = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.2)"
    return [sys.executable, "-c", script]


def _node_of_worker_1(kc: Path, namespace: str) -> str | None:
    return running_pods_on(kc, namespace, "health").get("health-worker-1")


@pytest.mark.parametrize("signal", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_ready_node_with_a_health_signal_has_its_worker_replaced(
    cluster: LocalCluster, signal: Signal, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    namespace = new_namespace(kc)
    release = tmp_path / "release"
    command = _wait_for_file(release)
    job = job_manifest(
        "health",
        namespace,
        nodes=2,
        instanceType="p5.48xlarge",
        command=command,
        failurePolicy={"nodeLossGraceSeconds": NODE_LOSS_GRACE_SECONDS},
    )
    victim = ""
    try:
        with EmbeddedOperator(str(kc), namespaces=[namespace]):
            apply(kc, job, tmp_path)
            wait_state(kc, namespace, "health", "Running", timeout=180)
            placed = wait_for(lambda: p if len(p := running_pods_on(kc, namespace, "health")) == 2 else None)
            victim = placed["health-worker-1"]
            signal.cause(cluster, victim)
            moved = wait_for(
                lambda: node if (node := _node_of_worker_1(kc, namespace)) not in (None, victim) else None,
                timeout=180,
                message=f"worker 1 to run off {victim} ({signal.name})",
            )
            # Worker 0 stayed where it was, and worker 1 never joins it there.
            worker_0 = running_pods_on(kc, namespace, "health").get("health-worker-0")
            assert worker_0 == placed["health-worker-0"] != moved
            # A Ready node (once its heartbeats are in, on a busy machine): the signal alone moved the worker.
            wait_for(lambda: cluster.node_ready_status(victim) == "True", message=f"{victim} to be Ready")
            status = job_status(kc, namespace, "health")
            fault = next(f for f in status["nodeFaults"] if f["nodeName"] == victim)
            assert (fault["count"], fault["lastReason"]) == (1, signal.reason)
            excluded = [e["nodeName"] for e in status["excludedNodes"]]
            assert excluded == ([victim] if signal.permanent else [])
            assert status["restarts"]["podReplacement"] == 1
            assert events.NODE_LOST in event_reasons(kc, namespace, "health")
            release.touch()
            done = wait_state(kc, namespace, "health", "Succeeded", timeout=180)
            assert done["restarts"]["podReplacement"] == 1
    finally:
        release.touch()
        if victim:
            signal.heal(cluster, victim)
        kubectl(kc, "delete", "namespace", namespace, "--wait=false", check=False)
