"""The progress endpoint from inside a pod of the embedded local cluster (or a real cluster's): rtj-launch,
the pod's main process, serves the report its child wrote with the endpoint sink at GET /progress and
the trainer's metrics at GET /metrics, on the pod's IP, to a client outside the pod (the operator's
place); the pod runs without any service-account token, as the operator renders trainer pods."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rtj_contract import env as env_names
from rtj_contract import progress as progress_contract
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, wait_for
from rtj_operator import names

pytestmark = pytest.mark.slow

SCRIPT = """
import time
from rtj_trainer.library import progress
p = progress.Progress(node_rank=0, train_start_time=1700000000.0)
p.step = 42
p.restarts_in_process = 1
progress.make_sink("endpoint").send(progress.progress_json(p, now=1700000100.0))
print("sent", flush=True)
time.sleep(600)
"""


def fetch(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
            return body if response.status == 200 else None
    except OSError:
        return None


def test_progress_and_metrics_are_served_from_inside_a_pod_without_a_token(
    shared_local_cluster: LocalCluster, api: SyncKubeClient
) -> None:
    ns = create_namespace(shared_local_cluster.kubeconfig_path, "t")
    try:
        api.create(
            path_for("serviceaccounts", ns),
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "trainer"},
                "automountServiceAccountToken": False,
            },
        )
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "worker"},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": "trainer",
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "main",
                        "image": "trainer:test",
                        "command": ["rtj-launch", "--", "python", "-c", SCRIPT],
                        "env": [
                            {"name": "RTJ_LAUNCH_MODE", "value": "direct"},
                            {"name": env_names.PROGRESS_PORT, "value": str(progress_contract.PORT)},
                        ],
                        "ports": [
                            {"name": names.PROGRESS_PORT_NAME, "containerPort": progress_contract.PORT}
                        ],
                    }
                ],
            },
        }
        created = api.create(path_for("pods", ns), pod)
        # Admission mounted no token: nothing in the pod can call the API server as the trainer.
        mounts = [m["mountPath"] for c in created["spec"]["containers"] for m in c.get("volumeMounts", [])]
        assert not [m for m in mounts if "serviceaccount" in m], mounts

        def running_ip() -> str | None:
            current = api.get_or_none(path_for("pods", ns, "worker")) or {}
            status = current.get("status", {})
            assert status.get("phase") not in ("Failed", "Succeeded"), status
            return str(status["podIP"]) if status.get("phase") == "Running" and status.get("podIP") else None

        ip = wait_for(running_ip, timeout=180, message="the pod to run")
        base = f"http://{ip}:{progress_contract.PORT}"
        report = json.loads(wait_for(lambda: fetch(base + progress_contract.PATH), timeout=120))
        assert report["step"] == 42 and report["restarts"] == {"inProcess": 1, "inJob": 0}
        assert report["trainStartTime"] == "2023-11-14T22:13:20.000000Z"
        text = fetch(base + "/metrics")
        assert text is not None
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples
        }
        assert samples[("rtj_trainer_step", ())] == 42
        assert samples[("rtj_trainer_restarts_total", (("layer", "in_process"),))] == 1
        assert samples[("rtj_trainer_goodput_ratio", ())] == 0.0
    finally:
        api.delete(path_for("namespaces", name=ns))
