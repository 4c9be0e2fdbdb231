"""A hot spare refilled while a node is NotReady takes that node once it is Ready again: on the local
cluster's real scheduler, with the node lifecycle controller's taints."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from operator_cluster import (
    apply,
    install_crd,
    job_manifest,
    job_status,
    pods,
    running_pods_on,
    wait_state,
)
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import wait_for
from rtj_operator.main import EmbeddedOperator

pytestmark = pytest.mark.slow


# The node goes NotReady by its kubelet's own report, which the lifecycle controller acts on at once: no
# missed heartbeat needs detecting quickly. Kubernetes' default grace keeps a machine too busy to renew
# the leases in time from losing the nodes, which would make the spare's node a repeat offender (the
# test's NotReady spell is its first fault), excluded with nowhere else for the spare to go.
@pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=40.0)
def test_a_spare_refilled_while_its_node_was_not_ready_takes_it_once_ready(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    started = time.monotonic()
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        apply(kc, job_manifest("refill", "default", nodes=2, hotSpares=1), tmp_path)
        wait_state(kc, "default", "refill", "Running")
        placed = wait_for(lambda: p if len(p := running_pods_on(kc, "default", "refill")) == 3 else None)
        spare_node = placed["refill-spare-0"]
        first_spare = pods(kc, "default", "refill")["refill-spare-0"]["metadata"]["uid"]
        local_cluster.make_node_not_ready(spare_node, "runtime restarting")

        def refilled() -> dict[str, object] | None:
            spare = pods(kc, "default", "refill").get("refill-spare-0")
            return spare if spare and spare["metadata"]["uid"] != first_spare else None

        # The spare on the NotReady node is replaced; its successor waits: every other node is taken.
        successor = wait_for(refilled, timeout=90, message="a new spare to be created")
        assert not successor["spec"].get("nodeName")  # type: ignore[index]
        local_cluster.heal_node(spare_node)
        wait_for(
            lambda: running_pods_on(kc, "default", "refill").get("refill-spare-0") == spare_node,
            timeout=90,
            message="the new spare to run on the recovered node",
        )
        status = wait_for(
            lambda: s if (s := job_status(kc, "default", "refill"))["workers"]["readySpares"] == 1 else None,
            timeout=60,
            message="one ready spare in status",
        )
        assert status["state"] == "Running" and status["excludedNodes"] == []
    print(f"wall time {time.monotonic() - started:.1f} s")
