"""The simulated nodes' profiles (pure): what a p5.48xlarge Node advertises."""

from __future__ import annotations

from rtj_localcluster.nodes import PROFILES, node_object, node_status


def test_p5_profile_labels_and_capacity() -> None:
    node = node_object("ip-1", PROFILES["p5.48xlarge"], zone="us-east-1a", gpu_taint=True)
    labels = node["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert labels["kubernetes.io/hostname"] == "ip-1"
    assert labels["kubernetes.io/os"] == "linux"
    assert "kubernetes.io/arch" in labels
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    status = node_status(PROFILES["p5.48xlarge"], host_ip="127.0.0.1", kubelet_port=10250)
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
    # The API server proxies `kubectl logs` to this port of the node's InternalIP.
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    assert status["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"}]
