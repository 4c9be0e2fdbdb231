"""The scheduler against the embedded cluster: binding, Unschedulable + FailedScheduling, admission
defaults, and retry when capacity appears."""

from __future__ import annotations

from typing import Any

import pytest
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import wait_for

pytestmark = pytest.mark.slow


def sleeper(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "command": ["python", "-c", "import time; time.sleep(600)"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
            **spec,
        },
    }


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in pod.get("status", {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def test_pod_requesting_too_many_gpus_stays_pending_with_failed_scheduling(
    api: SyncKubeClient, namespace: str
) -> None:
    api.create(path_for("pods", namespace), sleeper("greedy", 9))

    def unschedulable() -> dict[str, Any] | None:
        pod = api.get(path_for("pods", namespace, "greedy"))
        return pod if condition(pod, "PodScheduled").get("reason") == "Unschedulable" else None

    pod = wait_for(unschedulable, timeout=60, message="PodScheduled=False/Unschedulable")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    scheduled = condition(pod, "PodScheduled")
    assert scheduled["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]

    def failed_scheduling() -> list[dict[str, Any]]:
        events = api.get(path_for("events", namespace))["items"]
        return [
            e for e in events if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "greedy"
        ]

    events = wait_for(failed_scheduling, timeout=30, message="a FailedScheduling event")
    assert events[0]["type"] == "Warning"
    assert "Insufficient nvidia.com/gpu" in events[0]["message"]


def test_binding_honours_selector_and_adds_default_tolerations(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    target = shared_local_cluster.node_names[-1]
    api.create(
        path_for("pods", namespace), sleeper("pinned", 8, nodeSelector={"kubernetes.io/hostname": target})
    )

    def bound() -> dict[str, Any] | None:
        pod = api.get(path_for("pods", namespace, "pinned"))
        return pod if pod["spec"].get("nodeName") else None

    pod = wait_for(bound, timeout=60, message="the pod to be bound")
    assert pod["spec"]["nodeName"] == target
    tolerations = {(t["key"], t.get("tolerationSeconds")) for t in pod["spec"]["tolerations"]}
    assert ("node.kubernetes.io/not-ready", 300) in tolerations
    assert ("node.kubernetes.io/unreachable", 300) in tolerations

    # The node's 8 GPUs are taken: a second pinned GPU pod waits, and binds once the first is gone.
    api.create(
        path_for("pods", namespace), sleeper("waiting", 1, nodeSelector={"kubernetes.io/hostname": target})
    )
    wait_for(
        lambda: (
            condition(api.get(path_for("pods", namespace, "waiting")), "PodScheduled").get("reason")
            == "Unschedulable"
        ),
        timeout=60,
        message="the second pod to be unschedulable",
    )
    api.delete(path_for("pods", namespace, "pinned"))
    wait_for(
        lambda: api.get_or_none(path_for("pods", namespace, "pinned")) is None, timeout=60, message="delete"
    )
    moved = wait_for(
        lambda: api.get(path_for("pods", namespace, "waiting"))["spec"].get("nodeName"),
        timeout=60,
        message="the waiting pod to be bound",
    )
    assert moved == target
