"""Helpers for the operator's tests against a Kubernetes API: the embedded local cluster by default,
a real cluster when RTJ_TEST_KUBECONFIG is set. The operator runs in-process (`EmbeddedOperator`),
serving only the test's own namespace so that tests sharing a cluster never touch each other's jobs.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rtj_localcluster.client import RESOURCES, ApiError, SyncKubeClient, path_for
from rtj_localcluster.testing import REAL_CLUSTER_ENV, create_namespace, kubectl, wait_for
from rtj_operator import constants

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


def install_crd(kubeconfig: str | os.PathLike[str]) -> None:
    kubectl(kubeconfig, "apply", "-f", str(CRD_DIR))
    wait_for(
        lambda: (
            "resilienttrainingjobs" in kubectl(kubeconfig, "api-resources", f"--api-group={constants.GROUP}")
        ),
        timeout=60,
        message="the ResilientTrainingJob API to be served",
    )


def new_namespace(kubeconfig: str | os.PathLike[str]) -> str:
    return create_namespace(kubeconfig, "rtj-test")


def job_manifest(
    name: str, namespace: str, *, nodes: int = 2, command: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    storage: dict[str, Any] = {"capacity": "1Gi"}
    if not os.environ.get(REAL_CLUSTER_ENV):
        storage["storageClassName"] = "local"
    body: dict[str, Any] = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "rtj-trainer:0.1.0",
            "nodes": nodes,
            "instanceType": "cpu",
            "command": command or SLEEP,
            # rtj-launch execs the command itself: no ft_launcher, no torch, no CPU spent.
            "env": [{"name": "RTJ_LAUNCH_MODE", "value": "direct"}],
            "checkpoint": {"storage": {"dynamic": storage}},
            "failurePolicy": {"nodeLossGraceSeconds": 2, "backoffSeconds": 1},
            "terminationGracePeriodSeconds": 2,
        },
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body["spec"].get(key), dict):
            body["spec"][key] = {**body["spec"][key], **value}
        else:
            body["spec"][key] = value
    return body


def apply(kubeconfig: str | os.PathLike[str], manifest: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / f"{manifest['metadata']['name']}-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    kubectl(kubeconfig, "apply", "-f", str(path))


# kubectl's names of the resources the tests poll -> the local cluster client's (`client.RESOURCES`,
# whose `path_for` knows their paths); the job's own resource is `rtj`.
_POLLED = {
    "pods": "pods",
    "events": "events",
    "node": "nodes",
    "nodes": "nodes",
    "pvc": "persistentvolumeclaims",
    "service": "services",
    "lease": "leases",
}


def _polled_path(args: tuple[str, ...]) -> tuple[str, dict[str, str]] | None:
    """The API path and query of `kubectl get ARGS` when ARGS is one of the forms the tests poll
    (`[-n NS] RESOURCE [NAME]`, `[-n NS] RESOURCE -l SELECTOR`); None for any other form."""
    rest, namespace, params = list(args), "", {}
    if rest[:1] == ["-n"] and len(rest) >= 2:
        namespace, rest = rest[1], rest[2:]
    if len(rest) == 3 and rest[1] == "-l":
        params, rest = {"labelSelector": rest[2]}, rest[:1]
    if not 1 <= len(rest) <= 2:
        return None
    name = rest[1] if len(rest) == 2 else None
    if rest[0] == "rtj" and namespace:
        path = f"/apis/{constants.API_VERSION}/namespaces/{namespace}/{constants.PLURAL}"
        return (f"{path}/{name}" if name else path), params
    resource = _POLLED.get(rest[0])
    if resource is None or RESOURCES[resource][1] != bool(namespace):
        return None
    return path_for(resource, namespace or None, name), params


def get(kubeconfig: str | os.PathLike[str], *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json`, {} when it fails. The forms the tests poll in a loop (a job, pods,
    events, nodes, claims, Services, Leases) are read from the API directly on the local cluster: a
    kubectl process costs about 0.05 s of CPU, and the polls of one test file took 760 of them."""
    polled = None if os.environ.get(REAL_CLUSTER_ENV) else _polled_path(args)
    if polled is not None:
        path, params = polled
        try:
            with SyncKubeClient(kubeconfig) as client:
                found: dict[str, Any] = client.get(path, **params)
        except (ApiError, OSError, aiohttp.ClientError, TimeoutError):
            return {}
        return found
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    result: dict[str, Any] = json.loads(out) if out.strip() else {}
    return result


def job_status(kubeconfig: str | os.PathLike[str], namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get(kubeconfig, "-n", namespace, "rtj", name).get("status") or {}
    return status


def pods(kubeconfig: str | os.PathLike[str], namespace: str, job: str) -> dict[str, dict[str, Any]]:
    items = get(kubeconfig, "-n", namespace, "pods", "-l", f"{constants.LABEL_JOB}={job}").get("items") or []
    return {p["metadata"]["name"]: p for p in items}


def job_events(kubeconfig: str | os.PathLike[str], namespace: str, job: str) -> list[dict[str, Any]]:
    items = get(kubeconfig, "-n", namespace, "events").get("items") or []
    return [
        e
        for e in items
        if e.get("involvedObject", {}).get("kind") == constants.KIND
        and e["involvedObject"].get("name") == job
    ]


def event_reasons(kubeconfig: str | os.PathLike[str], namespace: str, job: str) -> list[str]:
    return [e.get("reason", "") for e in job_events(kubeconfig, namespace, job)]


def event_lines(kubeconfig: str | os.PathLike[str], namespace: str, job: str) -> str:
    """The job's Events as `reason: message` lines, for an assertion's message."""
    return "\n".join(f"{e.get('reason')}: {e.get('message')}" for e in job_events(kubeconfig, namespace, job))


def wait_state(
    kubeconfig: str | os.PathLike[str], namespace: str, job: str, state: str, *, timeout: float = 120
) -> dict[str, Any]:
    """The job's status once its state is `state`; on a timeout the error shows the last status seen
    (its conditions say what holds the state back)."""
    seen: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        seen.update(status=job_status(kubeconfig, namespace, job))
        return seen["status"] if seen["status"].get("state") == state else None

    try:
        return wait_for(reached, timeout=timeout, interval=0.3, message=f"job {job} to be {state}")
    except AssertionError as error:
        raise AssertionError(f"{error}; last status: {json.dumps(seen.get('status'))[:6000]}") from None


def running_pods_on(kubeconfig: str | os.PathLike[str], namespace: str, job: str) -> dict[str, str]:
    """Pod name -> node of the job's pods that are Running and not terminating."""
    return {
        name: pod["spec"].get("nodeName", "")
        for name, pod in pods(kubeconfig, namespace, job).items()
        if pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
    }
