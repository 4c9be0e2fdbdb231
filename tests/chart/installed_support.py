"""Helpers for the tests of an installed chart: read objects with kubectl, find the operator's pod, and
scrape a worker's Prometheus metrics as a PodMonitor would."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rtj_contract import progress as progress_contract
from rtj_localcluster.testing import kubectl

RELEASE = "rtj"


def get_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    """`kubectl get ... -o json`, or {} when there is no such object."""
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    loaded: dict[str, Any] = json.loads(out) if out.strip() else {}
    return loaded


def operator_pod(kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    """The release's running operator pod in `namespace` (not one being deleted), if any."""
    listing = get_json(kubeconfig, "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={RELEASE}")
    running = [
        p
        for p in listing.get("items") or []
        if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return running[0] if running else None


def trainer_step(kubeconfig: Path, namespace: str, pod_name: str) -> float | None:
    """The `rtj_trainer_step` a worker pod serves at /metrics on its progress port (a PodMonitor's
    scrape), parsed by prometheus_client's parser; None until it serves one above 0."""
    pod = get_json(kubeconfig, "pod", pod_name, "-n", namespace)
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        return None
    try:
        with urllib.request.urlopen(
            f"http://{ip}:{progress_contract.PORT}{progress_contract.METRICS_PATH}", timeout=5
        ) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    steps = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rtj_trainer_step"
    ]
    return steps[0] if steps and steps[0] > 0 else None
