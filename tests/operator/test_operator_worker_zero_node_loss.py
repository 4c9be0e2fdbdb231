"""Losing worker 0's node on the local cluster: the real control plane judges the node, the operator
files the loss as a NodeLost (not as the survivor's process failure it causes), and the job finishes.

The workers run a small stand-in for the trainer's rendezvous (direct launch mode, no torch): worker 0
serves a TCP port as the c10d store would, worker 1 holds a connection to it and exits 1 the moment
the connection drops, as ft_launcher does when it loses the rendezvous store. Killing worker 0's node
therefore makes worker 1 fail within a second, long before the node is marked NotReady: the order in
which the operator sees the two faults on a real cluster.
"""

from __future__ import annotations

import time
from pathlib import Path

import prometheus_client
import pytest
from operator_cluster import apply, event_reasons, install_crd, job_manifest, job_status, pods, wait_state
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import wait_for
from rtj_operator import events
from rtj_operator.main import EmbeddedOperator

pytestmark = pytest.mark.slow

# Worker 0 serves the "store" until worker 1 says it is done; worker 1 connects (retrying while the
# Service record appears), trains for HOLD seconds, and fails if the store goes away before that.
HOLD_SECONDS = 25
STAND_IN = f"""
import os, socket, sys, time
rank, port = int(os.environ["RTJ_NODE_RANK"]), int(os.environ["RTJ_RDZV_PORT"])
if rank == 0:
    server = socket.create_server(("", port))
    peer, _ = server.accept()
    sys.exit(0 if peer.recv(1) == b"d" else 1)
deadline = time.monotonic() + 120
while True:
    try:
        store = socket.create_connection((os.environ["RTJ_RDZV_HOST"], port), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(2)
        time.sleep(0.5)
store.settimeout({HOLD_SECONDS})
try:
    lost = store.recv(1) == b""
except socket.timeout:
    store.sendall(b"d")
    sys.exit(0)
print("lost the rendezvous store", flush=True)
sys.exit(1 if lost else 0)
"""


def node_losses_counted() -> float:
    """rtj_node_losses_total of the operator running in this process."""
    return prometheus_client.REGISTRY.get_sample_value("rtj_node_losses_total") or 0.0


@pytest.mark.local_cluster(nodes=4, profile="cpu", node_monitor_grace_seconds=3.0)
def test_losing_worker_zeros_node_is_a_node_loss_and_the_job_still_succeeds(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    started = time.monotonic()
    node_losses_before = node_losses_counted()
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = job_manifest(
            "zero",
            "default",
            nodes=2,
            command=["python", "-c", STAND_IN],
            rendezvous={"port": reserve_port()},
            failurePolicy={"repeatOffenderThreshold": 1},
        )
        apply(kc, job, tmp_path)
        wait_state(kc, "default", "zero", "Running")
        time.sleep(2)  # worker 1 holds its connection to worker 0's port
        lost = pods(kc, "default", "zero")["zero-worker-0"]["spec"]["nodeName"]
        local_cluster.kill_node(lost)

        def recorded() -> dict[str, object] | None:
            status = job_status(kc, "default", "zero")
            return status if any(f["nodeName"] == lost for f in status.get("nodeFaults", [])) else None

        status = wait_for(recorded, timeout=120, message="worker 0's node in status.nodeFaults")
        assert [e["nodeName"] for e in status["excludedNodes"]] == [lost]
        # Nothing of the job is left on the dead node: its pod was force-deleted, none is Terminating.
        wait_for(
            lambda: (
                not [p for p in pods(kc, "default", "zero").values() if p["spec"].get("nodeName") == lost]
            ),
            timeout=60,
            message="no pod of the job left on the dead node",
        )
        done = wait_state(kc, "default", "zero", "Succeeded", timeout=180)
        reasons = event_reasons(kc, "default", "zero")
        assert events.NODE_LOST in reasons
        assert reasons.count(events.NODE_EXCLUDED) == 1
        # Worker 0 hosts the rendezvous store, so its loss restarts the gang, counted once.
        assert done["restarts"]["podReplacement"] == 1
        assert done["budget"]["failuresUsed"] == 1
        assert node_losses_counted() == node_losses_before + 1
    print(f"wall time {time.monotonic() - started:.1f} s")
