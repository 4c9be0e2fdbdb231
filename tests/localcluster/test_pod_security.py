"""Which Pod Security level a training namespace needs, asked of the real API server's PodSecurity
admission with server-side dry runs of the worker pod the operator renders: `baseline` refuses it for
the IPC_LOCK capability (EFA memory registration), `privileged` admits it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rtj_localcluster.binaries import program
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, kubectl
from rtj_operator import api
from rtj_operator.render import render

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def worker_pod(namespace: str) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "p5-2node.yaml").read_text())
    body["metadata"] = {"name": "psa", "namespace": namespace, "uid": "0c6f1e0e-0000-4000-8000-000000000002"}
    pod = next(o for o in render(api.parse_job(body)) if o["kind"] == "Pod")
    pod["metadata"].pop("ownerReferences", None)
    return pod


@pytest.fixture
def kubeconfig_path(shared_local_cluster: LocalCluster) -> Iterator[Path]:
    yield shared_local_cluster.kubeconfig_path


@pytest.mark.parametrize(("level", "admitted"), [("privileged", True), ("baseline", False)])
def test_training_namespace_needs_privileged_for_ipc_lock(
    kubeconfig_path: Path, tmp_path: Path, level: str, admitted: bool
) -> None:
    namespace = create_namespace(
        kubeconfig_path, f"psa-{level}", labels={"pod-security.kubernetes.io/enforce": level}
    )
    pod = worker_pod(namespace)
    kubectl(kubeconfig_path, "create", "serviceaccount", pod["spec"]["serviceAccountName"], "-n", namespace)
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(pod))
    result = subprocess.run(
        [
            str(program("kubectl")),
            f"--kubeconfig={kubeconfig_path}",
            "create",
            "--dry-run=server",
            "-f",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if admitted:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert f'violates PodSecurity "{level}:latest"' in result.stderr, result.stderr
        assert "non-default capabilities" in result.stderr and "IPC_LOCK" in result.stderr, result.stderr
    kubectl(kubeconfig_path, "delete", "namespace", namespace, "--wait=false")
