"""The chart's RBAC is the least that works, shown by the API server's own audit log.

The chart is installed into the local cluster's real control plane (audit log on) with node tainting
on and one FSx file system allowed for the training namespace, which enforces Pod Security
`baseline`. The operator runs as a pod under the chart's ServiceAccount through a representative
scenario: a job naming a file system not allowed there (Blocked, no PersistentVolume), a job naming
the allowed one (its PersistentVolume, deleted with the job), a gang-admitted job (its coscheduling
PodGroup), and a real training job with a PodDisruptionBudget whose worker's node dies (node
excluded and tainted, worker replaced on another node; a worker's log read with `kubectl logs` and its
metrics scraped as a PodMonitor would), which then succeeds and is deleted by its TTL with its
checkpoint claim. Then every (API group, resource, verb) the chart grants was used by
the operator's identity, and none of its requests was refused.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_support import CHART
from installed_support import RELEASE, get_json, operator_pod, trainer_step
from rtj_localcluster.binaries import program
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import create_namespace, kubectl, wait_for
from rtj_operator import events

pytestmark = [
    pytest.mark.slow,
    pytest.mark.local_cluster(nodes=4, profile="cpu", node_monitor_grace_seconds=5, audit_log=True),
]
REPO = Path(__file__).resolve().parents[2]
FULLNAME = f"{RELEASE}-resilient-training-operator"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
BASELINE = {"pod-security.kubernetes.io/enforce": "baseline"}
FS_ALLOWED = "fs-0123456789abcdef0"
FS_OTHER = "fs-0fedcba9876543210"

Permission = tuple[str, str, str]


def apply(kubeconfig: Path, body: dict[str, Any], tmp_path: Path) -> None:
    manifest = tmp_path / f"{body['metadata']['name']}.yaml"
    manifest.write_text(yaml.safe_dump(body))
    kubectl(kubeconfig, "apply", "-f", str(manifest))


def blocked(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any] | None:
    status = get_json(kubeconfig, "rtj", name, "-n", namespace).get("status") or {}
    return next(
        (c for c in status.get("conditions") or [] if c["type"] == "Blocked" and c["status"] == "True"), None
    )


def fsx_job(name: str, namespace: str, file_system: str) -> dict[str, Any]:
    storage = {
        "fileSystemId": file_system,
        "dnsName": f"{file_system}.fsx.us-east-1.amazonaws.com",
        "mountName": "abcdefgh",
        "capacity": "1Gi",
    }
    return {
        "apiVersion": "resilient.training/v1alpha1",
        "kind": "ResilientTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "rtj-trainer:0.1.0",
            "nodes": 1,
            "instanceType": "cpu",
            "command": ["python", "-c", "import time; time.sleep(600)"],
            "env": [{"name": "RTJ_LAUNCH_MODE", "value": "direct"}],
            "checkpoint": {"retentionPolicy": "Delete", "storage": {"fsxStatic": storage}},
            "terminationGracePeriodSeconds": 2,
        },
    }


def training_job(namespace: str, operator_node: str) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    job["metadata"] = {"name": "train", "namespace": namespace}
    spec = job["spec"]
    spec["args"] = ["--steps", "60", "--hidden", "64", "--layers", "2"]
    spec["checkpoint"]["intervalSteps"] = 10
    # The first fault of a node excludes it (and taints it: taintExcludedNodes).
    spec["failurePolicy"].update({"taintExcludedNodes": True, "repeatOffenderThreshold": 1})
    spec["ttlSecondsAfterFinished"] = 5
    # The opt-in PodDisruptionBudget (a rule of the chart's, exercised here).
    spec["disruption"] = {"podDisruptionBudget": {"maxUnavailable": 1}}
    off_the_operators_node = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [operator_node]}
    spec.setdefault("scheduling", {})["requiredNodeAffinityTerms"] = [
        {"matchExpressions": [off_the_operators_node]}
    ]
    return job


# The scheduler-plugins PodGroup kind, as far as the API server must know it to store one: a
# coscheduling job's PodGroup is created by the operator whether or not that scheduler runs.
POD_GROUP_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def gang_job(namespace: str) -> dict[str, Any]:
    """A job admitted as a gang by the coscheduling plugin: its PodGroup is what matters here (no
    such scheduler runs on the local cluster, so its pods stay Pending)."""
    job = fsx_job("gang", namespace, FS_ALLOWED)
    job["spec"]["scheduling"] = {"gang": {"coscheduling": {}}}
    return job


@pytest.fixture
def audited(local_cluster: LocalCluster) -> Iterator[tuple[LocalCluster, str, str]]:
    kubeconfig = local_cluster.kubeconfig_path
    namespace = create_namespace(kubeconfig, "rtj-system", labels=RESTRICTED)
    # Training pods prepare their checkpoint directory with a root init container: `baseline`.
    team = create_namespace(kubeconfig, "team", labels=BASELINE)
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace, storage_driver="secret")
    # One replica (elected, as by default): the local cluster's pods share the host's ports.
    # Pinned to the first node, which training avoids (`training_job`): the node the test kills is
    # never the operator's own.
    values = {
        "replicaCount": 1,
        "nodeSelector": {"kubernetes.io/hostname": local_cluster.node_names[0]},
        "operator": {"healthPort": reserve_port()},
        "metrics": {"port": reserve_port()},
        "nodeTainting": {"enabled": True},
        "fsx": {"allowedFileSystems": {team: [FS_ALLOWED]}},
    }
    try:
        assert (
            config.install(CHART, RELEASE, values, namespace=namespace, timeout=120)["status"] == "deployed"
        )
        yield local_cluster, namespace, team
    finally:
        config.close()


def granted_rules(kubeconfig: Path, namespace: str) -> set[Permission]:
    rules = get_json(kubeconfig, "clusterrole", FULLNAME)["rules"]
    rules += get_json(kubeconfig, "clusterrole", f"{FULLNAME}-cluster")["rules"]
    # Leader election's Lease, in the operator's own namespace.
    rules += get_json(kubeconfig, "role", f"{FULLNAME}-leader-election", "-n", namespace)["rules"]
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def audit_events(path: Path, username: str) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") == username and event.get("objectRef"):
            found.append(event)
    return found


def used(event: dict[str, Any]) -> Permission:
    ref = event["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return (ref.get("apiGroup", ""), resource, event["verb"])


def persistent_volume(namespace: str, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "probe"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": "probe"},
            **source,
        },
    }


def fsx_source(file_system: str, dns_of: str | None = None) -> dict[str, Any]:
    dns = f"{dns_of or file_system}.fsx.us-east-1.amazonaws.com"
    return {"csi": {"driver": "fsx.csi.aws.com", "volumeHandle": file_system,
                    "volumeAttributes": {"dnsname": dns, "mountname": "abcdefgh"}}}  # fmt: skip


def create_as_operator(kubeconfig: Path, account: str, body: dict[str, Any], tmp_path: Path) -> str:
    """A server-side dry run of `body` created as the operator's ServiceAccount: "" or the refusal."""
    manifest = tmp_path / "probe.json"
    manifest.write_text(json.dumps(body))
    result = subprocess.run(
        [str(program("kubectl")), f"--kubeconfig={kubeconfig}", "create", "--dry-run=server",
         f"--as={account}", "-f", str(manifest)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return "" if result.returncode == 0 else result.stderr


def test_every_rule_of_the_charts_rbac_is_used_and_nothing_is_refused(
    audited: tuple[LocalCluster, str, str], tmp_path: Path
) -> None:
    cluster, namespace, team = audited
    kubeconfig = cluster.kubeconfig_path
    account = f"system:serviceaccount:{namespace}:{FULLNAME}"

    # The API server enforces the allow-list too (the chart's ValidatingAdmissionPolicy): the
    # operator's identity can create only an allowed FSx volume, whatever the operator does.
    assert (
        create_as_operator(kubeconfig, account, persistent_volume(team, fsx_source(FS_ALLOWED)), tmp_path)
        == ""
    )
    refusals = {
        "another file system": persistent_volume(team, fsx_source(FS_OTHER)),
        "an allowed id, another DNS name": persistent_volume(team, fsx_source(FS_ALLOWED, dns_of=FS_OTHER)),
        "another namespace": persistent_volume("default", fsx_source(FS_ALLOWED)),
        "a hostPath": persistent_volume(team, {"hostPath": {"path": "/"}}),
    }
    # The API server loads a new policy and its binding asynchronously (about a second).
    wait_for(
        lambda: create_as_operator(kubeconfig, account, refusals["another file system"], tmp_path),
        timeout=60,
        interval=1,
        message="the admission policy to be in force: "
        + json.dumps(get_json(kubeconfig, "validatingadmissionpolicy", f"{FULLNAME}-fsx").get("status")),
    )
    for case, body in refusals.items():
        refusal = create_as_operator(kubeconfig, account, body, tmp_path)
        assert "ValidatingAdmissionPolicy" in refusal and "denied request" in refusal, (case, refusal)
    assert "only FSx for Lustre" in create_as_operator(kubeconfig, account, refusals["a hostPath"], tmp_path)

    # A file system not allowed for the namespace: Blocked, and no PersistentVolume.
    apply(kubeconfig, fsx_job("fsx-other", team, FS_OTHER), tmp_path)
    condition = wait_for(lambda: blocked(kubeconfig, team, "fsx-other"), timeout=180, message="Blocked")
    assert condition["reason"] == events.FILE_SYSTEM_NOT_ALLOWED
    assert "spec.checkpoint.storage.fsxStatic.fileSystemId" in condition["message"]
    assert f"namespace '{team}'" in condition["message"]
    assert not get_json(kubeconfig, "pv", f"fsx-other-checkpoints-{team}")
    assert not get_json(kubeconfig, "pods", "-n", team).get("items")

    # The allowed one gets its PersistentVolume, deleted with the job (retentionPolicy Delete).
    apply(kubeconfig, fsx_job("fsx-ok", team, FS_ALLOWED), tmp_path)
    pv = wait_for(
        lambda: get_json(kubeconfig, "pv", f"fsx-ok-checkpoints-{team}"), timeout=120, message="the FSx PV"
    )
    assert pv["spec"]["csi"]["volumeHandle"] == FS_ALLOWED
    assert not blocked(kubeconfig, team, "fsx-ok")
    kubectl(kubeconfig, "delete", "rtj", "fsx-ok", "-n", team, "--wait=false")

    # A gang-admitted job: the operator creates its coscheduling PodGroup.
    apply(kubeconfig, POD_GROUP_CRD, tmp_path)
    crd = "podgroups.scheduling.x-k8s.io"
    wait_for(lambda: get_json(kubeconfig, "crd", crd).get("status", {}).get("acceptedNames", {}).get("kind"),
             timeout=60, message="the PodGroup CRD")  # fmt: skip
    apply(kubeconfig, gang_job(team), tmp_path)
    group = wait_for(lambda: get_json(kubeconfig, "podgroups", "gang", "-n", team), timeout=120,
                     message="the job's PodGroup")  # fmt: skip
    assert group["spec"]["minMember"] == 1
    kubectl(kubeconfig, "delete", "rtj", "gang", "-n", team, "--wait=false")
    kubectl(kubeconfig, "delete", "rtj", "fsx-other", "-n", team, "--wait=false")
    wait_for(
        lambda: not get_json(kubeconfig, "pv", f"fsx-ok-checkpoints-{team}"),
        timeout=120,
        message="PV deleted",
    )

    # Real training under Pod Security baseline; the node of worker 1 dies mid-run.
    apply(kubeconfig, training_job(team, cluster.node_names[0]), tmp_path)

    def step() -> int:
        status = get_json(kubeconfig, "rtj", "train", "-n", team).get("status") or {}
        return int((status.get("progress") or {}).get("step") or 0)

    wait_for(lambda: step() >= 3, timeout=300, interval=1, message="training to make progress")
    # A worker's log reads through kubectl logs, and its Prometheus metrics as a PodMonitor scrapes them.
    assert kubectl(kubeconfig, "logs", "train-worker-0", "-n", team).strip()
    scraped = wait_for(
        lambda: trainer_step(kubeconfig, team, "train-worker-0"), timeout=120, message="trainer metrics"
    )
    assert 0 < scraped <= 60
    lost = get_json(kubeconfig, "pod", "train-worker-1", "-n", team)["spec"]["nodeName"]
    cluster.kill_node(lost)

    def tainted() -> bool:
        taints = get_json(kubeconfig, "node", lost).get("spec", {}).get("taints") or []
        return any(t["key"] == "resilient.training/excluded" for t in taints)

    wait_for(tainted, timeout=120, interval=1, message="the lost node to be tainted")
    replaced = wait_for(
        lambda: (
            (p := get_json(kubeconfig, "pod", "train-worker-1", "-n", team))
            and p["spec"].get("nodeName") not in (None, lost)
            and p
        ),
        timeout=180,
        interval=1,
        message="worker 1 replaced on another node",
    )
    assert replaced["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert (
        get_json(kubeconfig, "pdb", "train-workers", "-n", team)["spec"]["minAvailable"] == 1
    )  # 2 nodes - 1
    # Succeeded, then deleted by its TTL with its claim (retentionPolicy Delete).
    wait_for(lambda: not get_json(kubeconfig, "rtj", "train", "-n", team), timeout=600, interval=2,
             message="the job to succeed and expire")  # fmt: skip
    wait_for(lambda: not get_json(kubeconfig, "pvc", "train-checkpoints", "-n", team), timeout=60,
             message="the claim deleted")  # fmt: skip

    # The operator's own log: it logged in with its pod's token and was never refused anything.
    operator = operator_pod(kubeconfig, namespace)
    assert operator is not None
    log = kubectl(kubeconfig, "logs", operator["metadata"]["name"], "-n", namespace)
    assert "Initial authentication has finished" in log
    assert "forbidden" not in log.lower(), log

    path = cluster.control_plane.audit_log_path if cluster.control_plane else None
    assert path is not None and path.exists()
    requests = audit_events(path, account)
    refused = [e for e in requests if (e.get("responseStatus") or {}).get("code") == 403]
    assert not refused, [(used(e), e["requestURI"]) for e in refused]
    exercised = {used(e) for e in requests}
    granted = granted_rules(kubeconfig, namespace)
    assert exercised <= granted
    unused = granted - exercised
    assert not unused, f"granted but never used in the scenario: {sorted(unused)}"
