"""Which Pod Security level a training namespace needs, asked of the real API server's PodSecurity
admission with server-side dry runs of the worker pod the operator renders: a p5 (EFA) worker adds
the IPC_LOCK capability (EFA memory registration), which `baseline` and `restricted` refuse and only
`privileged` admits; a worker without EFA adapters (the `cpu` profile) meets `restricted`."""

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


def worker_pod(namespace: str, example: str) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / example).read_text())
    body["metadata"] = {"name": "psa", "namespace": namespace, "uid": "0c6f1e0e-0000-4000-8000-000000000002"}
    pod = next(o for o in render(api.parse_job(body)) if o["kind"] == "Pod")
    pod["metadata"].pop("ownerReferences", None)
    return pod


@pytest.fixture
def kubeconfig_path(shared_local_cluster: LocalCluster) -> Iterator[Path]:
    yield shared_local_cluster.kubeconfig_path


@pytest.mark.parametrize(
    ("example", "level", "admitted"),
    [
        ("p5-2node.yaml", "privileged", True),
        ("p5-2node.yaml", "baseline", False),
        ("p5-2node.yaml", "restricted", False),
        ("local-cpu.yaml", "restricted", True),
    ],
)
def test_efa_workers_need_privileged_for_ipc_lock_and_others_meet_restricted(
    kubeconfig_path: Path, tmp_path: Path, example: str, level: str, admitted: bool
) -> None:
    namespace = create_namespace(
        kubeconfig_path, f"psa-{level}", labels={"pod-security.kubernetes.io/enforce": level}
    )
    pod = worker_pod(namespace, example)
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
        # IPC_LOCK is the only objection: everything else of `restricted` is met.
        assert "IPC_LOCK" in result.stderr, result.stderr
        objections = result.stderr.split(f'violates PodSecurity "{level}:latest": ', 1)[1]
        assert objections.strip().startswith(("non-default capabilities", "unrestricted capabilities")), (
            objections
        )
        assert ")," not in objections, objections  # PodSecurity lists each objection as "what (detail)"
    kubectl(kubeconfig_path, "delete", "namespace", namespace, "--wait=false")
