"""The progress sink patches its own pod's annotation through the in-cluster service account,
from inside a pod of the embedded local cluster (or a real cluster's API)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, wait_for
from rtj_trainer import progress

pytestmark = pytest.mark.slow

SCRIPT = """
import os
from rtj_trainer import progress
p = progress.Progress(node_rank=0, train_start_time=1700000000.0)
p.step = 42
p.restarts_in_process = 1
sink = progress.make_sink("pod-annotation", os.environ["RTJ_NAMESPACE"], os.environ["RTJ_POD_NAME"])
report = progress.progress_json(p, now=1700000100.0)
sink.send(report)
print("sent")
"""


def test_progress_annotation_is_patched_from_inside_the_pod(
    shared_local_cluster: LocalCluster, api: SyncKubeClient
) -> None:
    ns = create_namespace(shared_local_cluster.kubeconfig_path, "t")
    try:
        api.create(
            path_for("serviceaccounts", ns),
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}},
        )
        # What the operator grants a job's trainer ServiceAccount: get and patch of its own pods.
        api.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "trainer"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["pods"],
                        "verbs": ["get", "patch"],
                        "resourceNames": ["worker"],
                    }
                ],
            },
        )
        api.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "trainer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainer"},
                "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": ns}],
            },
        )
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "worker"},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": "trainer",
                "containers": [
                    {
                        "name": "main",
                        "image": "trainer:test",
                        "command": ["python", "-c", SCRIPT],
                        "env": [
                            {
                                "name": "RTJ_POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {
                                "name": "RTJ_NAMESPACE",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                            },
                        ],
                    }
                ],
            },
        }
        api.create(path_for("pods", ns), pod)

        def annotated() -> dict[str, Any] | None:
            current = api.get_or_none(path_for("pods", ns, "worker")) or {}
            phase = current.get("status", {}).get("phase")
            assert phase != "Failed", current.get("status")
            value = current.get("metadata", {}).get("annotations", {}).get(progress.ANNOTATION)
            # The script exits once it sent: Succeeded without the annotation is a failed send.
            assert value or phase != "Succeeded", current.get("status")
            return json.loads(value) if value else None

        report = wait_for(annotated, timeout=180, message="the progress annotation")
        assert report["step"] == 42
        assert report["restarts"] == {"inProcess": 1, "inJob": 0}
        assert report["trainStartTime"] == "2023-11-14T22:13:20.000000Z"
    finally:
        api.delete(path_for("namespaces", name=ns))
