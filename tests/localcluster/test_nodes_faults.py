"""Node faults on the local cluster, and what the real controllers make of them: kill -> Ready=Unknown
(node lifecycle controller), taints, eviction by toleration (taint eviction controller), stuck
Terminating, force delete, node delete + pod GC; partition keeps processes running; heal restores
Ready."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import process_ended, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.local_cluster(nodes=2, node_monitor_grace_seconds=3.0)]
GRACE = 3.0
# Scheduling noise on a loaded 2-core machine: generous, and only an upper bound.
SLACK = 20.0
# Pod GC looks every 20 s and leaves a pod of a vanished node alone for 40 s (kube-controller-manager's
# gcCheckPeriod and quarantine time): a minute and some.
POD_GC_SECONDS = 20.0 + 40.0 + SLACK
UNREACHABLE = "node.kubernetes.io/unreachable"


@pytest.fixture
def api(local_cluster: LocalCluster) -> Iterator[SyncKubeClient]:
    with SyncKubeClient(local_cluster.kubeconfig_path) as client:
        yield client


def sleeper(name: str, node: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": tolerations,
            "containers": [
                {"name": "main", "image": "x", "command": ["python", "-c", "import time; time.sleep(600)"]}
            ],
        },
    }


def running_pid(api: SyncKubeClient, name: str) -> int:
    def check() -> int | None:
        pod = api.get(path_for("pods", "default", name))
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        if "running" in statuses[0].get("state", {}):
            return int(statuses[0]["containerID"].removeprefix("process://"))
        return None

    return wait_for(check, timeout=90, message=f"{name} running")


def ready_status(api: SyncKubeClient, node: str) -> str | None:
    obj = api.get_or_none(path_for("nodes", name=node))
    for item in (obj or {}).get("status", {}).get("conditions") or []:
        if item["type"] == "Ready":
            return str(item["status"])
    return None


def test_node_kill_marks_unknown_taints_and_evicts_by_toleration(
    local_cluster: LocalCluster, api: SyncKubeClient
) -> None:
    node = local_cluster.node_names[0]
    short = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]
    forever = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]
    api.create(path_for("pods", "default"), sleeper("short", node, short))
    api.create(path_for("pods", "default"), sleeper("forever", node, forever))
    pids = [running_pid(api, "short"), running_pid(api, "forever")]

    killed = time.monotonic()
    local_cluster.kill_node(node)
    wait_for(lambda: all(process_ended(p) for p in pids), timeout=30, message="the processes to die")
    wait_for(lambda: ready_status(api, node) == "Unknown", timeout=GRACE + SLACK, message="Ready=Unknown")
    unknown_after = time.monotonic() - killed
    # Never before the grace period, counted from the last renewal (at most one heartbeat before the kill).
    assert unknown_after >= GRACE - 1.0
    node_obj = api.get(path_for("nodes", name=node))
    ready = next(c for c in node_obj["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == (
        "NodeStatusUnknown",
        "Kubelet stopped posting node status.",
    )
    wait_for(
        lambda: any(
            t["key"] == UNREACHABLE and t["effect"] == "NoExecute"
            for t in api.get(path_for("nodes", name=node))["spec"].get("taints") or []
        ),
        timeout=SLACK,
        message="the unreachable NoExecute taint",
    )

    evicted = wait_for(
        lambda: (
            (p := api.get(path_for("pods", "default", "short")))["metadata"].get("deletionTimestamp") and p
        ),
        timeout=2 + SLACK,
        message="the short-toleration pod to be evicted",
    )
    disruption = next(c for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert disruption["reason"] == "DeletionByTaintManager"
    # The kubelet is dead: nobody finishes the delete, the pod stays Terminating.
    time.sleep(3)
    assert api.get_or_none(path_for("pods", "default", "short")) is not None
    kept = api.get(path_for("pods", "default", "forever"))
    assert not kept["metadata"].get("deletionTimestamp")

    api.delete(path_for("pods", "default", "short"), grace_period_seconds=0)
    assert api.get_or_none(path_for("pods", "default", "short")) is None

    local_cluster.delete_node(node)
    wait_for(
        lambda: api.get_or_none(path_for("pods", "default", "forever")) is None,
        timeout=POD_GC_SECONDS,
        message="pod GC of the deleted node's pod",
    )


def test_partition_keeps_processes_running_and_heal_restores_ready(
    local_cluster: LocalCluster, api: SyncKubeClient
) -> None:
    partitioned, killed = local_cluster.node_names
    forever = [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]
    api.create(path_for("pods", "default"), sleeper("on-partitioned", partitioned, forever))
    api.create(path_for("pods", "default"), sleeper("on-killed", killed, forever))
    partitioned_pid = running_pid(api, "on-partitioned")
    killed_pid = running_pid(api, "on-killed")

    local_cluster.partition_node(partitioned)
    local_cluster.kill_node(killed)
    wait_for(
        lambda: ready_status(api, partitioned) == "Unknown",
        timeout=GRACE + SLACK,
        message="partitioned Unknown",
    )
    wait_for(lambda: ready_status(api, killed) == "Unknown", timeout=GRACE + SLACK, message="killed Unknown")
    assert not process_ended(partitioned_pid)
    assert wait_for(lambda: process_ended(killed_pid), timeout=30, message="the killed node's process to die")

    local_cluster.heal_node(partitioned)
    wait_for(
        lambda: ready_status(api, partitioned) == "True", timeout=SLACK, message="Ready again after heal"
    )
    wait_for(
        lambda: (
            not any(
                t["key"] == UNREACHABLE
                for t in api.get(path_for("nodes", name=partitioned))["spec"].get("taints") or []
            )
        ),
        timeout=SLACK,
        message="the unreachable taint to be removed",
    )
    assert not process_ended(partitioned_pid)
    assert ready_status(api, killed) == "Unknown"


@pytest.mark.local_cluster(nodes=1, node_monitor_grace_seconds=3.0)
def test_added_node_takes_new_pods(local_cluster: LocalCluster, api: SyncKubeClient) -> None:
    added = local_cluster.add_node(profile="cpu")
    assert added in local_cluster.node_names
    node = api.get(path_for("nodes", name=added))
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "cpu"
    assert ready_status(api, added) == "True"
    api.create(path_for("pods", "default"), sleeper("on-new-node", added, []))
    running_pid(api, "on-new-node")
    with pytest.raises(ValueError, match="already exists"):
        local_cluster.add_node(added)


def test_not_ready_node_gets_not_ready_taint_and_evicts_until_healed(
    local_cluster: LocalCluster, api: SyncKubeClient
) -> None:
    node = local_cluster.node_names[0]
    not_ready = "node.kubernetes.io/not-ready"
    short = [{"key": not_ready, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]
    api.create(path_for("pods", "default"), sleeper("evicted", node, short))
    pid = running_pid(api, "evicted")

    local_cluster.make_node_not_ready(node, "GPU fell off the bus")
    wait_for(lambda: ready_status(api, node) == "False", timeout=SLACK, message="Ready=False")
    ready = next(
        c for c in api.get(path_for("nodes", name=node))["status"]["conditions"] if c["type"] == "Ready"
    )
    assert (ready["reason"], ready["message"]) == ("KubeletNotReady", "GPU fell off the bus")
    # The kubelet is alive: the eviction completes (SIGTERM, then the final delete).
    wait_for(
        lambda: api.get_or_none(path_for("pods", "default", "evicted")) is None,
        timeout=SLACK + 30,
        message="the evicted pod to be gone",
    )
    wait_for(lambda: process_ended(pid), timeout=30, message="the evicted pod's process to exit")
    local_cluster.heal_node(node)
    wait_for(lambda: ready_status(api, node) == "True", timeout=SLACK, message="Ready again")
    wait_for(
        lambda: (
            not any(
                t["key"] == not_ready
                for t in api.get(path_for("nodes", name=node))["spec"].get("taints") or []
            )
        ),
        timeout=SLACK,
        message="the not-ready taint to be removed",
    )


def test_out_of_service_taint_releases_terminating_pods_of_a_dead_node(
    local_cluster: LocalCluster, api: SyncKubeClient
) -> None:
    node = local_cluster.node_names[0]
    forever = [{"operator": "Exists"}]  # tolerates every taint: only a delete moves it
    api.create(path_for("pods", "default"), sleeper("stuck", node, forever))
    running_pid(api, "stuck")
    local_cluster.kill_node(node)
    wait_for(lambda: ready_status(api, node) == "Unknown", timeout=GRACE + SLACK, message="Ready=Unknown")
    api.delete(path_for("pods", "default", "stuck"))
    time.sleep(2)
    assert api.get(path_for("pods", "default", "stuck"))["metadata"].get("deletionTimestamp")

    taints = api.get(path_for("nodes", name=node))["spec"].get("taints") or []
    taint = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
    api.patch(path_for("nodes", name=node), {"spec": {"taints": [*taints, taint]}})
    wait_for(
        lambda: api.get_or_none(path_for("pods", "default", "stuck")) is None,
        timeout=20.0 + SLACK,
        message="the terminating pod to be force-deleted",
    )
