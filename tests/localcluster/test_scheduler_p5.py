"""A p5 job's pods as the operator renders them, placed by the real kube-scheduler: each worker lands
on its own node with the GPUs, EFA adapters and hugepages it requests, never on a node without them;
a worker that fits nowhere stays Pending with the scheduler's own FailedScheduling event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, kubectl, wait_for
from rtj_operator import api
from rtj_operator.render import render

pytestmark = [pytest.mark.slow, pytest.mark.local_cluster(nodes=2, profile="p5.48xlarge")]
REPO = Path(__file__).resolve().parents[2]
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


def rendered_job(namespace: str, nodes: int) -> list[dict[str, Any]]:
    """examples/p5-2node.yaml with `nodes` workers, each running a sleep instead of training."""
    body = yaml.safe_load((REPO / "examples" / "p5-2node.yaml").read_text())
    body["metadata"] = {"name": "p5", "namespace": namespace, "uid": "0c6f1e0e-0000-4000-8000-000000000001"}
    body["spec"]["nodes"] = nodes
    body["spec"]["command"] = SLEEP
    body["spec"]["args"] = []
    body["spec"]["env"] = [*body["spec"].get("env", []), {"name": "RTJ_LAUNCH_MODE", "value": "direct"}]
    objects = render(api.parse_job(body))
    for obj in objects:
        obj.get("metadata", {}).pop("ownerReferences", None)  # no job object exists in this test
    return objects


def pod(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl(kubeconfig, "get", "pod", name, "-n", namespace, "-o", "json")
    loaded: dict[str, Any] = json.loads(out)
    return loaded


def test_p5_workers_land_on_p5_nodes_and_the_one_too_many_waits(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kubeconfig = local_cluster.kubeconfig_path
    cpu_node = local_cluster.add_node(profile="cpu")
    namespace = create_namespace(kubeconfig, "p5")
    storage_class = tmp_path / "class.yaml"
    storage_class.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": "fsx-sc"},
                "provisioner": "fsx.csi.aws.com",
                "reclaimPolicy": "Delete",
            }
        )
    )
    kubectl(kubeconfig, "apply", "-f", str(storage_class))
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump_all(rendered_job(namespace, nodes=3)))
    kubectl(kubeconfig, "apply", "-f", str(manifest))

    workers = [f"p5-worker-{index}" for index in range(3)]

    def placed() -> dict[str, str] | None:
        """The two bound workers' nodes, by pod: the scheduler takes the three pods in no set order
        (each first waits for the claim to be bound), so any two of them may be the ones that fit."""
        nodes = {name: pod(kubeconfig, namespace, name)["spec"].get("nodeName") for name in workers}
        bound = {name: node for name, node in nodes.items() if node}
        return bound if len(bound) == 2 else None

    nodes = wait_for(placed, timeout=120, message="two workers bound")
    p5_nodes = {n for n in local_cluster.node_names if n != cpu_node}
    assert set(nodes.values()) == p5_nodes  # one per p5 node, none on the cpu node
    (waiting,) = set(workers) - set(nodes)
    requests = pod(kubeconfig, namespace, next(iter(nodes)))["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == "8" and requests["vpc.amazonaws.com/efa"] == "32"
    assert "hugepages-2Mi" in requests

    def full_nodes_reported() -> str | None:
        """The scheduler's account of the nodes for the waiting worker, once the claim is bound (before
        that, each pod's FailedScheduling names the unbound claim)."""
        events = json.loads(
            kubectl(
                kubeconfig,
                "get",
                "events",
                "-n",
                namespace,
                f"--field-selector=involvedObject.name={waiting}",
                "-o",
                "json",
            )
        )["items"]
        messages = [
            e["message"]
            for e in events
            if e["reason"] == "FailedScheduling"
            and "unbound immediate PersistentVolumeClaims" not in e["message"]
        ]
        return messages[-1] if messages else None

    message = wait_for(
        full_nodes_reported, timeout=60, message=f"FailedScheduling for {waiting}, the third worker"
    )
    third = pod(kubeconfig, namespace, waiting)
    assert third["status"]["phase"] == "Pending" and not third["spec"].get("nodeName")
    # kube-scheduler's own account of each node: the p5 nodes are full, the cpu node lacks the devices
    # and the instance type.
    assert "0/3 nodes are available" in message, message
    assert "Insufficient nvidia.com/gpu" in message or "didn't match pod anti-affinity rules" in message, (
        message
    )
    assert "didn't match Pod's node affinity/selector" in message, message
