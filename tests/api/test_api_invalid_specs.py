"""Invalid jobs are rejected with a message naming the field, by parse_job and by the CRD (schema + CEL).

Each case changes one thing in a valid job. ``crd`` says how the API server sees it: "schema" (OpenAPI
validation), "cel" (an x-kubernetes-validations rule) or None where the API server has no equivalent
(unknown fields are pruned, not rejected; apiVersion/kind select the resource).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from crd_tools import crd_errors
from rtj_operator import api


def valid_job() -> dict[str, Any]:
    return {
        "apiVersion": "resilient.training/v1alpha1",
        "kind": "ResilientTrainingJob",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "image": "trainer:1",
            "nodes": 2,
            "instanceType": "cpu",
            "checkpoint": {"storage": {"dynamic": {"storageClassName": "local", "capacity": "1Gi"}}},
            "faultTolerance": {"heartbeatTimeoutSeconds": 120, "initialHeartbeatTimeoutSeconds": 300},
        },
    }


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        obj = obj.setdefault(part, {})
    if value is _DELETE:
        del obj[last]
    else:
        obj[last] = value


_DELETE = object()
FSX = {"fileSystemId": "fs-0123456789abcdef0", "dnsName": "fs.example", "mountName": "m"}

CASES: list[tuple[str, dict[str, Any], str, str | None]] = [
    # (id, {path: new value}, the field the error must name, how the CRD rejects it)
    ("image-missing", {"spec.image": _DELETE}, "spec.image", "schema"),
    ("image-empty", {"spec.image": ""}, "spec.image", "schema"),
    ("nodes-zero", {"spec.nodes": 0}, "spec.nodes", "schema"),
    ("nodes-too-many", {"spec.nodes": 5000}, "spec.nodes", "schema"),
    ("nodes-a-string", {"spec.nodes": "2"}, "spec.nodes", "schema"),
    ("nodes-missing", {"spec.nodes": _DELETE}, "spec.nodes", "schema"),
    ("hot-spares-negative", {"spec.hotSpares": -1}, "spec.hotSpares", "schema"),
    ("processes-per-node-zero", {"spec.processesPerNode": 0}, "spec.processesPerNode", "schema"),
    ("pull-policy-unknown", {"spec.imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy", "schema"),
    ("command-empty", {"spec.command": []}, "spec.command", "schema"),
    ("suspend-a-string", {"spec.suspend": "yes"}, "spec.suspend", "schema"),
    ("checkpoint-missing", {"spec.checkpoint": _DELETE}, "spec.checkpoint", "schema"),
    ("storage-none", {"spec.checkpoint.storage": {}}, "spec.checkpoint.storage", "cel"),
    (
        "storage-two",
        {"spec.checkpoint.storage.existingClaim": {"claimName": "c"}},
        "spec.checkpoint.storage",
        "cel",
    ),
    (
        "fsx-bad-id",
        {"spec.checkpoint.storage": {"fsxStatic": {**FSX, "fileSystemId": "filesystem-1"}}},
        "spec.checkpoint.storage.fsxStatic.fileSystemId",
        "schema",
    ),
    (
        "fsx-no-dns-name",
        {"spec.checkpoint.storage": {"fsxStatic": {k: v for k, v in FSX.items() if k != "dnsName"}}},
        "spec.checkpoint.storage.fsxStatic.dnsName",
        "schema",
    ),
    (
        "capacity-not-a-quantity",
        {"spec.checkpoint.storage.dynamic.capacity": "lots"},
        "spec.checkpoint.storage.dynamic.capacity",
        "schema",
    ),
    ("checkpoint-mode-unknown", {"spec.checkpoint.mode": "Lazy"}, "spec.checkpoint.mode", "schema"),
    ("mount-path-relative", {"spec.checkpoint.mountPath": "ckpt"}, "spec.checkpoint.mountPath", "schema"),
    ("interval-zero", {"spec.checkpoint.intervalSteps": 0}, "spec.checkpoint.intervalSteps", "schema"),
    (
        "retention-unknown",
        {"spec.checkpoint.retentionPolicy": "Keep"},
        "spec.checkpoint.retentionPolicy",
        "schema",
    ),
    (
        "initial-heartbeat-below-heartbeat",
        {"spec.faultTolerance.initialHeartbeatTimeoutSeconds": 60},
        "spec.faultTolerance.initialHeartbeatTimeoutSeconds",
        "cel",
    ),
    (
        "monitor-interval-not-below-heartbeat",
        {"spec.faultTolerance.monitorIntervalSeconds": 120},
        "spec.faultTolerance.monitorIntervalSeconds",
        "cel",
    ),
    (
        "hard-timeout-not-above-soft",
        {"spec.faultTolerance.inProcess": {"softTimeoutSeconds": 30, "hardTimeoutSeconds": 30}},
        "spec.faultTolerance.inProcess.hardTimeoutSeconds",
        "cel",
    ),
    (
        "heartbeat-not-above-in-process-hard-timeout",
        {"spec.faultTolerance.inProcess": {"softTimeoutSeconds": 60, "hardTimeoutSeconds": 150}},
        "spec.faultTolerance.heartbeatTimeoutSeconds",
        "cel",
    ),
    (
        "max-in-job-restarts-negative",
        {"spec.faultTolerance.maxInJobRestarts": -1},
        "spec.faultTolerance.maxInJobRestarts",
        "schema",
    ),
    ("unknown-instance-type-unsized", {"spec.instanceType": "g5.48xlarge"}, "spec.resources", "cel"),
    ("memory-not-a-quantity", {"spec.resources.memory": "2 GB"}, "spec.resources.memory", "schema"),
    ("gpus-a-string", {"spec.resources.gpus": "8"}, "spec.resources.gpus", "schema"),
    ("rendezvous-port-too-high", {"spec.rendezvous.port": 70000}, "spec.rendezvous.port", "schema"),
    (
        "env-value-and-value-from",
        {"spec.env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]},
        "spec.env[0]",
        "cel",
    ),
    ("env-without-name", {"spec.env": [{"value": "1"}]}, "spec.env[0].name", "schema"),
    ("volume-reserved-name", {"spec.volumes": [{"name": "rtj-shm", "emptyDir": {}}]}, "spec.volumes", "cel"),
    (
        "mount-of-unknown-volume",
        {"spec.volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        "spec.volumeMounts",
        "cel",
    ),
    (
        "mount-over-dev-shm",
        {
            "spec.volumes": [{"name": "data", "emptyDir": {}}],
            "spec.volumeMounts": [{"name": "data", "mountPath": "/dev/shm"}],
        },
        "spec.volumeMounts",
        "cel",
    ),
    (
        "pod-label-reserved-prefix",
        {"spec.podLabels": {"resilient.training/role": "x"}},
        "spec.podLabels",
        "cel",
    ),
    (
        "toleration-effect-unknown",
        {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "effect": "Sometimes"}]},
        "spec.scheduling.tolerations[0].effect",
        "schema",
    ),
    (
        "affinity-operator-unknown",
        {
            "spec.scheduling.requiredNodeAffinityTerms": [
                {"matchExpressions": [{"key": "k", "operator": "Near"}]}
            ]
        },
        "spec.scheduling.requiredNodeAffinityTerms[0].matchExpressions[0].operator",
        "schema",
    ),
    (
        "repeat-offender-zero",
        {"spec.failurePolicy.repeatOffenderThreshold": 0},
        "spec.failurePolicy.repeatOffenderThreshold",
        "schema",
    ),
    (
        "grace-negative",
        {"spec.failurePolicy.nodeLossGraceSeconds": -5},
        "spec.failurePolicy.nodeLossGraceSeconds",
        "schema",
    ),
    (
        "pod-label-value-with-a-space",
        {"spec.podLabels": {"team": "ml infra"}},
        "spec.podLabels.team",
        "schema",
    ),
    (
        "node-selector-key-malformed",
        {"spec.scheduling.nodeSelector": {"bad key": "x"}},
        "spec.scheduling.nodeSelector['bad key']",
        None,
    ),
    (
        "volume-name-not-a-dns-label",
        {"spec.volumes": [{"name": "Data", "emptyDir": {}}]},
        "spec.volumes[0].name",
        "schema",
    ),
    (
        "claim-name-not-a-dns-subdomain",
        {"spec.checkpoint.storage": {"existingClaim": {"claimName": "my_claim"}}},
        "spec.checkpoint.storage.existingClaim.claimName",
        "schema",
    ),
    ("name-too-long", {"metadata.name": "a" * 51}, "metadata.name", "schema"),
    ("name-not-a-dns-label", {"metadata.name": "Train_1"}, "metadata.name", "schema"),
    ("unknown-spec-field", {"spec.hotspares": 2}, "spec.hotspares", None),
    ("unknown-nested-field", {"spec.checkpoint.intervalstep": 5}, "spec.checkpoint.intervalstep", None),
    ("wrong-api-version", {"apiVersion": "resilient.training/v1"}, "apiVersion", None),
]


def _job_with(changes: dict[str, Any]) -> dict[str, Any]:
    job = valid_job()
    for path, value in changes.items():
        _set(job, path, copy.deepcopy(value))
    return job


def test_the_base_job_is_valid_for_both() -> None:
    api.parse_job(valid_job())
    assert crd_errors(valid_job()) == []


def test_there_are_at_least_25_cases() -> None:
    assert len(CASES) >= 25
    assert sum(1 for case in CASES if case[3] == "cel") >= 10


@pytest.mark.parametrize(("changes", "field"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_parse_job_rejects_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(api.JobValidationError) as raised:
        api.parse_job(_job_with(changes))
    assert field in raised.value.paths, str(raised.value)
    # The message is one line per field, "path: reason".
    assert any(
        line.startswith(f"{field}: ") and len(line) > len(field) + 2
        for line in str(raised.value).splitlines()
    )


@pytest.mark.parametrize(
    ("changes", "field", "how"),
    [(c[1], c[2], c[3]) for c in CASES if c[3]],
    ids=[c[0] for c in CASES if c[3]],
)
def test_the_crd_rejects_naming_the_same_field(changes: dict[str, Any], field: str, how: str) -> None:
    errors = crd_errors(_job_with(changes))
    assert field in [path for path, _ in errors], errors
    if how == "cel":
        # The same sentence as parse_job's: both come from one CelRule.
        with pytest.raises(api.JobValidationError) as raised:
            api.parse_job(_job_with(changes))
        assert dict(errors)[field] in dict(raised.value.problems).values()


IMMUTABLE_CHANGES = [
    ("spec.nodes", 3),
    ("spec.instanceType", "p5.48xlarge"),
    ("spec.rendezvous", {"port": 29600}),
    ("spec.checkpoint.mountPath", "/data"),
    ("spec.checkpoint.storage", {"existingClaim": {"claimName": "c"}}),
    ("spec.processesPerNode", 4),
]


@pytest.mark.parametrize(("path", "value"), IMMUTABLE_CHANGES, ids=[p for p, _ in IMMUTABLE_CHANGES])
def test_immutable_fields_cannot_change_in_python_or_in_cel(path: str, value: Any) -> None:
    old = valid_job()
    new = _job_with({path: value})
    with pytest.raises(api.JobValidationError) as raised:
        api.check_update(api.parse_job(old), api.parse_job(new))
    assert path in raised.value.paths
    cel = crd_errors(new, old)
    assert path in [p for p, _ in cel], cel


def test_mutable_fields_may_change() -> None:
    old = valid_job()
    new = _job_with({"spec.suspend": True, "spec.hotSpares": 1, "spec.checkpoint.keep": 5})
    api.check_update(api.parse_job(old), api.parse_job(new))
    assert crd_errors(new, old) == []
