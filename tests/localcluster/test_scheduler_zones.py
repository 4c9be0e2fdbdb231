"""The rendered zone placement under the real kube-scheduler, on nodes in two zones: a job's pods
follow the zone its first pod got (a later pod waits rather than go elsewhere), and an FSx file
system's availabilityZone pins every pod of its job, the static PersistentVolume included.

The renderer's objects are applied as the operator would send them (without owner references:
no operator runs here, and the garbage collector would remove children of a missing owner).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, kubectl, wait_for
from rtj_operator import api, render

pytestmark = pytest.mark.slow

ZONE = "topology.kubernetes.io/zone"


def parsed(name: str, namespace: str, storage: dict[str, Any]) -> api.ResilientTrainingJob:
    return api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {
                "image": "rtj-trainer:0.1.0",
                "nodes": 2,
                "instanceType": "cpu",
                "command": ["python", "-c", "import time; time.sleep(600)"],
                "env": [{"name": "RTJ_LAUNCH_MODE", "value": "direct"}],
                "checkpoint": {"storage": storage},
                "terminationGracePeriodSeconds": 1,
            },
        }
    )


def apply(cluster: LocalCluster, objects: list[dict[str, Any]], tmp_path: Path, name: str) -> None:
    for obj in objects:
        obj["metadata"].pop("ownerReferences", None)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    kubectl(cluster.kubeconfig_path, "apply", "-f", str(path))


def zone_of_pod(client: SyncKubeClient, namespace: str, pod: str) -> str | None:
    node = client.get(path_for("pods", namespace, pod)).get("spec", {}).get("nodeName")
    if not node:
        return None
    return str(client.get(path_for("nodes", name=node))["metadata"]["labels"][ZONE])


@pytest.mark.local_cluster(nodes=4, profile="cpu", zones=("zone-a", "zone-b"))
def test_pods_follow_the_first_pods_zone_and_the_file_systems_zone(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = local_cluster
    namespace = create_namespace(cluster.kubeconfig_path, "zones")
    with SyncKubeClient(cluster.kubeconfig_path) as client:
        free = parsed("free", namespace, {"dynamic": {"storageClassName": "local", "capacity": "1Gi"}})
        apply(cluster, [*render.render_base(free), render.render_worker_pod(free, 0)], tmp_path, "free-0")
        first = wait_for(
            lambda: zone_of_pod(client, namespace, "free-worker-0"), timeout=90, message="worker 0"
        )
        # The first pod's zone has one node left: cordoned, the second worker must wait rather than
        # take the other zone's free nodes; uncordoned, it lands there.
        nodes = client.get(path_for("nodes"))["items"]
        occupied = client.get(path_for("pods", namespace, "free-worker-0"))["spec"]["nodeName"]
        (other,) = [
            n["metadata"]["name"]
            for n in nodes
            if n["metadata"]["labels"][ZONE] == first and n["metadata"]["name"] != occupied
        ]
        kubectl(cluster.kubeconfig_path, "cordon", other)
        apply(cluster, [render.render_worker_pod(free, 1)], tmp_path, "free-1")
        wait_for(
            lambda: any(
                c.get("reason") == "Unschedulable"
                for c in client.get(path_for("pods", namespace, "free-worker-1"))
                .get("status", {})
                .get("conditions", [])
            ),
            timeout=60,
            message="worker 1 unschedulable outside the first pod's zone",
        )
        assert zone_of_pod(client, namespace, "free-worker-1") is None
        kubectl(cluster.kubeconfig_path, "uncordon", other)
        assert wait_for(lambda: zone_of_pod(client, namespace, "free-worker-1"), timeout=90) == first

        # The FSx file system's zone, the other one: every pod goes there, and the PV says so too.
        fsx_zone = "zone-b" if first == "zone-a" else "zone-a"
        storage = {
            "fsxStatic": {
                "fileSystemId": "fs-0123456789abcdef0",
                "dnsName": "fs.example",
                "mountName": "abcdef",
                "capacity": "1Gi",
                "availabilityZone": fsx_zone,
            }
        }
        pinned = parsed("pinned", namespace, storage)
        apply(cluster, render.render(pinned), tmp_path, "pinned")
        for index in (0, 1):
            pod = f"pinned-worker-{index}"
            assert wait_for(lambda p=pod: zone_of_pod(client, namespace, p), timeout=90) == fsx_zone
        pv = client.get(path_for("persistentvolumes", name=f"pinned-checkpoints-{namespace}"))
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": [fsx_zone]}]}]
        for pod in ("free-worker-0", "free-worker-1", "pinned-worker-0", "pinned-worker-1"):
            wait_for(
                lambda p=pod: (
                    client.get(path_for("pods", namespace, p)).get("status", {}).get("phase") == "Running"
                ),
                timeout=120,
                message=f"{pod} running (its init container prepared the checkpoint directory)",
            )
