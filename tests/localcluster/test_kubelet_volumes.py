"""Volumes on the process kubelet: PV binding (static CSI PV by volumeName, class "" matching,
dynamic provisioning by StorageClass), configMap/secret files, hostPath, subPath."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import kubectl, wait_for, wait_phase

pytestmark = pytest.mark.slow


def claim(name: str, storage_class: str | None = None, volume_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if volume_name:
        spec["volumeName"] = volume_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def bound_volume(api: SyncKubeClient, namespace: str, name: str) -> dict[str, Any]:
    pvc = wait_for(
        lambda: (
            (c := api.get(path_for("persistentvolumeclaims", namespace, name))).get("status", {}).get("phase")
            == "Bound"
            and c
        ),
        timeout=60,
        message=f"PVC {name} Bound",
    )
    pv: dict[str, Any] = api.get(path_for("persistentvolumes", name=pvc["spec"]["volumeName"]))
    assert pv["spec"]["claimRef"]["name"] == name
    return pv


def test_static_csi_volume_class_matching_and_dynamic_class(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    fsx = f"fsx-{namespace}"
    api.create(
        path_for("persistentvolumes"),
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": fsx},
            "spec": {
                "capacity": {"storage": "1200Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "csi": {
                    "driver": "fsx.csi.aws.com",
                    "volumeHandle": "fs-0123456789abcdef0",
                    "volumeAttributes": {"dnsname": "fs.example", "mountname": "abcdef"},
                },
            },
        },
    )
    api.create(path_for("persistentvolumeclaims", namespace), claim("static", "", volume_name=fsx))
    pv = bound_volume(api, namespace, "static")
    assert pv["metadata"]["name"] == fsx

    api.create(
        path_for("storageclasses"),
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": f"fsx-sc-{namespace}"},
            "provisioner": "fsx.csi.aws.com",
            "reclaimPolicy": "Delete",
        },
    )
    api.create(path_for("persistentvolumeclaims", namespace), claim("dynamic", f"fsx-sc-{namespace}"))
    dynamic = bound_volume(api, namespace, "dynamic")
    assert dynamic["spec"]["storageClassName"] == f"fsx-sc-{namespace}"
    assert dynamic["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == "fsx.csi.aws.com"
    assert Path(dynamic["spec"]["hostPath"]["path"]).is_dir()

    api.create(path_for("persistentvolumeclaims", namespace), claim("missing-class", "no-such-class"))
    api.create(path_for("persistentvolumeclaims", namespace), claim("default-class"))
    assert bound_volume(api, namespace, "default-class")["spec"]["storageClassName"] == "local"
    pending = api.get(path_for("persistentvolumeclaims", namespace, "missing-class"))
    assert pending.get("status", {}).get("phase") != "Bound"

    # A pod writes through the static volume's mount; the data lands in the PV's directory.
    script = (
        "import os, sys; os.makedirs(os.path.dirname(sys.argv[1])); open(sys.argv[1], 'w').write('shard')"
    )
    api.create(
        path_for("pods", namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "writer"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "command": ["python", "-c", script, "/checkpoints/job/shard-0"],
                        "volumeMounts": [{"name": "ckpt", "mountPath": "/checkpoints", "subPath": "ns-a"}],
                    }
                ],
                "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "static"}}],
            },
        },
    )
    wait_for(
        lambda: (
            api.get(path_for("pods", namespace, "writer")).get("status", {}).get("phase")
            in ("Succeeded", "Failed")
        ),
        timeout=60,
        message="the writer to finish",
    )
    writer = api.get(path_for("pods", namespace, "writer"))
    assert writer["status"]["phase"] == "Succeeded", kubectl(
        shared_local_cluster.kubeconfig_path, "logs", "-n", namespace, "writer"
    )
    shard = shared_local_cluster.state_dir / "volumes" / fsx / "ns-a" / "job" / "shard-0"
    assert shard.read_text() == "shard"


def test_configmap_secret_and_host_path_volumes(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str, tmp_path: Path
) -> None:
    api.create(
        path_for("configmaps", namespace),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a.txt": "alpha"}},
    )
    api.create(
        path_for("secrets", namespace),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sec"},
            "data": {"key": base64.b64encode(b"s3cret").decode()},
        },
    )
    host = tmp_path / "host"
    host.mkdir()
    (host / "h.txt").write_text("from host")
    script = (
        "import sys\n"
        "cfg, sec, host = sys.argv[1:4]\n"
        "print(open(cfg).read(), open(sec).read(), open(host).read(), sep='|')"
    )
    api.create(
        path_for("pods", namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "reader"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "command": ["python", "-c", script],
                        "args": ["/etc/cfg/renamed.txt", "/etc/sec/key", "/host/h.txt"],
                        "volumeMounts": [
                            {"name": "cfg", "mountPath": "/etc/cfg"},
                            {"name": "sec", "mountPath": "/etc/sec"},
                            {"name": "host", "mountPath": "/host"},
                        ],
                    }
                ],
                "volumes": [
                    {
                        "name": "cfg",
                        "configMap": {"name": "cfg", "items": [{"key": "a.txt", "path": "renamed.txt"}]},
                    },
                    {"name": "sec", "secret": {"secretName": "sec"}},
                    {"name": "host", "hostPath": {"path": str(host)}},
                ],
            },
        },
    )
    pod = wait_phase(api, namespace, "reader", "Succeeded", "Failed", timeout=60)
    logs = kubectl(shared_local_cluster.kubeconfig_path, "logs", "-n", namespace, "reader")
    assert pod["status"]["phase"] == "Succeeded", logs
    assert logs.strip() == "alpha|s3cret|from host"


def test_pod_waits_for_a_configmap_its_volume_needs_then_starts(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    """A volume whose ConfigMap does not exist yet keeps the pod ContainerCreating with a
    FailedMount event (the way a new namespace's root CA ConfigMap arrives a moment late); once the
    ConfigMap appears the pod starts and reads it."""
    api.create(
        path_for("pods", namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "early"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "command": ["python", "-c", "import sys; print(open(sys.argv[1]).read())"],
                        "args": ["/etc/late/v"],
                        "volumeMounts": [{"name": "late", "mountPath": "/etc/late"}],
                    }
                ],
                "volumes": [{"name": "late", "configMap": {"name": "late"}}],
            },
        },
    )

    def waiting_reason() -> dict[str, Any] | None:
        statuses = api.get(path_for("pods", namespace, "early")).get("status", {}).get("containerStatuses")
        waiting = (statuses or [{}])[0].get("state", {}).get("waiting") or {}
        return waiting if "not found" in waiting.get("message", "") else None

    waiting = wait_for(waiting_reason, timeout=60, message="the pod waiting for its ConfigMap")
    assert waiting["reason"] == "ContainerCreating"
    assert 'configmap "late" not found' in waiting["message"]
    events = api.get(path_for("events", namespace))["items"]
    assert any(e["reason"] == "FailedMount" and e["involvedObject"]["name"] == "early" for e in events)

    api.create(
        path_for("configmaps", namespace),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}, "data": {"v": "arrived"}},
    )
    pod = wait_phase(api, namespace, "early", "Succeeded", "Failed", timeout=60)
    logs = kubectl(shared_local_cluster.kubeconfig_path, "logs", "-n", namespace, "early")
    assert pod["status"]["phase"] == "Succeeded", logs
    assert logs.strip() == "arrived"
