"""`kubectl top pod` and `kubectl top node` through the real API server's aggregator to the local
cluster's Metrics API, fed by the kubelets' /metrics/resource, with the control plane's own kubectl."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, kubectl, wait_for

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
# A busy loop holding 64 MiB, and an idle process beside it.
BURN = "x = bytearray(64 * 1024 * 1024)\nwhile True: pass"
IDLE = "import time\ntime.sleep(3600)"


@pytest.fixture(scope="module")
def namespace(shared_local_cluster: LocalCluster) -> Iterator[str]:
    config = shared_local_cluster.kubeconfig_path
    name = create_namespace(config, "top")
    for pod, code in (("burn", BURN), ("idle", IDLE)):
        kubectl(
            config, "-n", name, "run", pod, f"--labels=app={pod}", "--image=python:3.11", "--restart=Never",
            "--", "python3", "-c", code,
        )  # fmt: skip
    for pod in ("burn", "idle"):
        kubectl(config, "-n", name, "wait", "--for=condition=Ready", f"pod/{pod}", "--timeout=60s")
    yield name
    kubectl(config, "delete", "namespace", name, "--wait=false", check=False)


def _quantities(line: str) -> tuple[int, int]:
    """A `kubectl top` row's CPU (millicores) and memory (MiB)."""
    match = re.search(r"\s(\d+)m\s+(?:\d+%\s+)?(\d+)Mi\b", line)
    assert match, line
    return int(match.group(1)), int(match.group(2))


def _top_pods(config: str, namespace: str, *args: str) -> dict[str, str] | None:
    result = kubectl(config, "-n", namespace, "top", "pod", "--no-headers", *args, check=False)
    rows = {line.split()[0]: line for line in result.splitlines() if line.strip()}
    return rows or None


def test_the_metrics_api_is_registered_and_available(shared_local_cluster: LocalCluster) -> None:
    config = str(shared_local_cluster.kubeconfig_path)
    available = kubectl(
        config, "get", "apiservice", "v1beta1.metrics.k8s.io",
        "-o", "jsonpath={.status.conditions[?(@.type=='Available')].status}",
    )  # fmt: skip
    assert available == "True"
    resources = kubectl(config, "api-resources", "--api-group=metrics.k8s.io", "--no-headers")
    assert {line.split()[0] for line in resources.splitlines()} == {"nodes", "pods"}


def test_kubectl_top_pod_shows_what_each_pod_uses(shared_local_cluster: LocalCluster, namespace: str) -> None:
    config = str(shared_local_cluster.kubeconfig_path)
    rows = wait_for(
        lambda: (r := _top_pods(config, namespace)) and {"burn", "idle"} <= set(r) and r,
        timeout=90,
        interval=2,
        message="kubectl top pod to list both pods",
    )
    burn_cpu, burn_memory = _quantities(rows["burn"])
    idle_cpu, idle_memory = _quantities(rows["idle"])
    assert burn_memory >= 64 and idle_memory < burn_memory
    assert burn_cpu > 50 and idle_cpu < burn_cpu

    containers = kubectl(config, "-n", namespace, "top", "pod", "burn", "--containers", "--no-headers")
    [row] = containers.splitlines()
    assert row.split()[:2] == ["burn", "burn"]

    assert set(_top_pods(config, namespace, "-l", "app=idle") or {}) == {"idle"}
    assert _top_pods(config, namespace, "-l", "app=nothing") is None
    everywhere = kubectl(config, "top", "pod", "-A", "--no-headers")
    assert any(line.split()[:2] == [namespace, "burn"] for line in everywhere.splitlines())


def test_kubectl_top_node_shows_every_node(shared_local_cluster: LocalCluster, namespace: str) -> None:
    config = str(shared_local_cluster.kubeconfig_path)
    nodes = set(shared_local_cluster.node_names)

    def listed() -> dict[str, str] | None:
        rows = kubectl(config, "top", "node", "--no-headers", check=False).splitlines()
        found = {line.split()[0]: line for line in rows if line.strip()}
        return found if nodes <= set(found) else None

    rows = wait_for(listed, timeout=90, interval=2, message="kubectl top node to list every node")
    burn_node = kubectl(config, "-n", namespace, "get", "pod", "burn", "-o", "jsonpath={.spec.nodeName}")
    node_cpu, node_memory = _quantities(rows[burn_node])
    assert node_cpu > 50 and node_memory >= 64
