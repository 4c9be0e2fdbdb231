"""Node lifecycle rules (pure): condition taints and taint-based eviction timing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rtj_localcluster.nodes import PROFILES, desired_condition_taints, eviction_due, node_object, node_status

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
STAMP = "2026-01-01T12:00:00Z"


def node_with_ready(status: str) -> dict[str, Any]:
    node = node_object("n", PROFILES["p5.48xlarge"], gpu_taint=True)
    node["status"] = node_status(PROFILES["p5.48xlarge"], host_ip="127.0.0.1")
    for condition in node["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = status
    return node


def test_p5_profile_labels_and_capacity() -> None:
    node = node_object("ip-1", PROFILES["p5.48xlarge"], zone="us-east-1a", gpu_taint=True)
    labels = node["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert labels["kubernetes.io/hostname"] == "ip-1"
    assert labels["kubernetes.io/os"] == "linux"
    assert "kubernetes.io/arch" in labels
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    status = node_status(PROFILES["p5.48xlarge"], host_ip="127.0.0.1")
    for key, value in {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
        "cpu": "192",
        "memory": "2Ti",
        "pods": "110",
    }.items():
        assert status["capacity"][key] == value
        assert status["allocatable"][key] == value
    assert "hugepages-2Mi" in status["allocatable"]


def test_condition_taints_follow_ready() -> None:
    unknown = desired_condition_taints(node_with_ready("Unknown"), STAMP)
    assert {(t["key"], t["effect"]) for t in unknown} == {
        ("nvidia.com/gpu", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
    }
    assert next(t for t in unknown if t["effect"] == "NoExecute")["timeAdded"] == STAMP
    not_ready = desired_condition_taints(node_with_ready("False"), STAMP)
    assert ("node.kubernetes.io/not-ready", "NoExecute") in {(t["key"], t["effect"]) for t in not_ready}
    healed = node_with_ready("True")
    healed["spec"]["taints"] = unknown
    assert desired_condition_taints(healed, STAMP) == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    # Stable: an already tainted node keeps its timeAdded.
    again = node_with_ready("Unknown")
    again["spec"]["taints"] = unknown
    assert desired_condition_taints(again, "2030-01-01T00:00:00Z") == unknown


UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": STAMP}


def pod(*tolerations: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"tolerations": list(tolerations)}}


def test_eviction_timing() -> None:
    assert eviction_due(pod(), [UNREACHABLE], NOW) == 0.0
    short = {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 2,
    }
    assert eviction_due(pod(short), [UNREACHABLE], NOW) == 2.0
    assert eviction_due(pod(short), [UNREACHABLE], NOW + timedelta(seconds=3)) == -1.0
    forever = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    assert eviction_due(pod(forever), [UNREACHABLE], NOW) is None
    assert eviction_due(pod({"operator": "Exists"}), [UNREACHABLE], NOW) is None
    # NoSchedule taints never evict.
    assert eviction_due(pod(), [{"key": "x", "effect": "NoSchedule"}], NOW) is None
    # Negative tolerationSeconds count as zero.
    negative = {**short, "tolerationSeconds": -5}
    assert eviction_due(pod(negative), [UNREACHABLE], NOW) == 0.0
