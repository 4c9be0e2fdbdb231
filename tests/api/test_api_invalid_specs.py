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
        "launcher-unknown",
        {"spec.faultTolerance.launcher": "Torchrun"},
        "spec.faultTolerance.launcher",
        "schema",
    ),
    (
        "supervisor-without-in-process-restarts",
        {"spec.faultTolerance.launcher": "Supervisor", "spec.faultTolerance.inProcess": {"enabled": False}},
        "spec.faultTolerance.launcher",
        "cel",
    ),
    (
        "supervisor-store-port-has-no-next-port",
        {"spec.faultTolerance.launcher": "Supervisor", "spec.rendezvous.port": 65535},
        "spec.rendezvous.port",
        "cel",
    ),
    (
        "standby-spares-without-the-store-pod",
        {"spec.rendezvous.spares": "Standby"},
        "spec.rendezvous.spares",
        "cel",
    ),
    (
        "standby-spares-under-supervisor",
        {
            "spec.faultTolerance.launcher": "Supervisor",
            "spec.rendezvous": {"host": "StorePod", "spares": "Standby"},
        },
        "spec.rendezvous.spares",
        "cel",
    ),
    ("spares-unknown", {"spec.rendezvous.spares": "Sometimes"}, "spec.rendezvous.spares", "schema"),
    (
        "memory-interval-negative",
        {"spec.checkpoint.memoryIntervalSteps": -1},
        "spec.checkpoint.memoryIntervalSteps",
        "schema",
    ),
    (
        "memory-interval-too-large",
        {"spec.checkpoint.memoryIntervalSteps": 1_000_001},
        "spec.checkpoint.memoryIntervalSteps",
        "schema",
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
        {
            "spec.env": [
                {"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ]
        },
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
        "spec.scheduling.nodeSelector",
        "cel",
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
    # A training script of one's own: its step log pattern and ft_launcher's own settings. The API server
    # cannot compile a Python regex or see into the map of ft_launcher's settings: those are refused by
    # the operator alone (None).
    (
        "step-log-pattern-does-not-compile",
        {"spec.progress.stepLogPattern": "step (\\d+"},
        "spec.progress.stepLogPattern",
        None,
    ),
    (
        "step-log-pattern-without-a-group",
        {"spec.progress.stepLogPattern": "step \\d+"},
        "spec.progress.stepLogPattern",
        None,
    ),
    (
        "step-log-pattern-first-group-is-the-loss",
        {"spec.progress.stepLogPattern": "loss (?P<loss>\\S+) step (\\d+)"},
        "spec.progress.stepLogPattern",
        None,
    ),
    (
        "step-log-pattern-empty",
        {"spec.progress.stepLogPattern": ""},
        "spec.progress.stepLogPattern",
        "schema",
    ),
    (
        "step-log-pattern-too-long",
        {"spec.progress.stepLogPattern": "(\\d+)" + "x" * 252},
        "spec.progress.stepLogPattern",
        "schema",
    ),
    ("ft-launcher-empty", {"spec.faultTolerance.ftLauncher": {}}, "spec.faultTolerance.ftLauncher", "cel"),
    (
        "ft-launcher-config-and-config-map",
        {"spec.faultTolerance.ftLauncher": {"config": {"safety_factor": 4}, "configMap": {"name": "ft"}}},
        "spec.faultTolerance.ftLauncher",
        "cel",
    ),
    (
        "ft-launcher-under-supervisor",
        {
            "spec.faultTolerance.launcher": "Supervisor",
            "spec.faultTolerance.ftLauncher": {"configMap": {"name": "ft"}},
        },
        "spec.faultTolerance.ftLauncher",
        "cel",
    ),
    (
        "ft-launcher-config-sets-a-heartbeat-timeout",
        {"spec.faultTolerance.ftLauncher": {"config": {"rank_heartbeat_timeout": 60}}},
        "spec.faultTolerance.ftLauncher.config",
        None,
    ),
    (
        "heartbeat-timeout-off-but-not-the-initial-one",
        {
            "spec.faultTolerance.heartbeatTimeoutSeconds": 0,
            "spec.faultTolerance.inProcess": {"enabled": False},
        },
        "spec.faultTolerance.heartbeatTimeoutSeconds",
        "cel",
    ),
    (
        "heartbeat-timeouts-off-with-in-process-restarts",
        {
            "spec.faultTolerance.heartbeatTimeoutSeconds": 0,
            "spec.faultTolerance.initialHeartbeatTimeoutSeconds": 0,
        },
        "spec.faultTolerance.heartbeatTimeoutSeconds",
        "cel",
    ),
    (
        "ft-launcher-config-sets-max-restarts",
        {"spec.faultTolerance.ftLauncher": {"config": {"max_restarts": 3}}},
        "spec.faultTolerance.ftLauncher.config",
        None,
    ),
    (
        "ft-launcher-config-nests-its-section",
        {"spec.faultTolerance.ftLauncher": {"config": {"fault_tolerance": {"safety_factor": 4}}}},
        "spec.faultTolerance.ftLauncher.config",
        None,
    ),
    (
        "ft-launcher-config-too-many-keys",
        {"spec.faultTolerance.ftLauncher": {"config": {f"k{i}": i for i in range(65)}}},
        "spec.faultTolerance.ftLauncher.config",
        "schema",
    ),
    (
        "ft-launcher-config-a-list",
        {"spec.faultTolerance.ftLauncher": {"config": ["safety_factor"]}},
        "spec.faultTolerance.ftLauncher.config",
        "schema",
    ),
    (
        "ft-launcher-config-map-without-name",
        {"spec.faultTolerance.ftLauncher": {"configMap": {"key": "a"}}},
        "spec.faultTolerance.ftLauncher.configMap.name",
        "schema",
    ),
    (
        "ft-launcher-config-map-key-dot-dot",
        {"spec.faultTolerance.ftLauncher": {"configMap": {"name": "ft", "key": "..a"}}},
        "spec.faultTolerance.ftLauncher.configMap.key",
        "schema",
    ),
    (
        "ft-launcher-config-map-key-a-path",
        {"spec.faultTolerance.ftLauncher": {"configMap": {"name": "ft", "key": "a/b.yaml"}}},
        "spec.faultTolerance.ftLauncher.configMap.key",
        "schema",
    ),
    (
        "volume-reserved-name-ft-launcher",
        {"spec.volumes": [{"name": "rtj-ft-launcher", "emptyDir": {}}]},
        "spec.volumes",
        "cel",
    ),
    (
        "mount-over-ft-launcher-config",
        {
            "spec.volumes": [{"name": "data", "emptyDir": {}}],
            "spec.volumeMounts": [{"name": "data", "mountPath": "/etc/rtj/ft-launcher"}],
        },
        "spec.volumeMounts",
        "cel",
    ),
    (
        "checkpoint-over-ft-launcher-config",
        {"spec.checkpoint.mountPath": "/etc/rtj/ft-launcher"},
        "spec.checkpoint.mountPath",
        "cel",
    ),
    ("name-too-long", {"metadata.name": "a" * 51}, "metadata.name", "schema"),
    ("name-not-a-dns-label", {"metadata.name": "Train_1"}, "metadata.name", "schema"),
    ("unknown-spec-field", {"spec.hotspares": 2}, "spec.hotspares", None),
    ("unknown-nested-field", {"spec.checkpoint.intervalstep": 5}, "spec.checkpoint.intervalstep", None),
    ("wrong-api-version", {"apiVersion": "resilient.training/v1"}, "apiVersion", None),
]


# The Kubernetes types the spec embeds, each held to the rule the API server applies to the child it
# becomes (pkg/apis/core/validation): a spec accepted here never yields a pod or claim the server refuses.
DATA = [{"name": "data", "emptyDir": {}}]
BIG = 10**12


def _env(**entry: Any) -> dict[str, Any]:
    return {"spec.env": [{"name": "A", **entry}]}


def _value_from(source: dict[str, Any]) -> dict[str, Any]:
    return _env(valueFrom=source)


def _toleration(**fields: Any) -> dict[str, Any]:
    return {"spec.scheduling.tolerations": [fields]}


def _requirement(**fields: Any) -> dict[str, Any]:
    return {"spec.scheduling.requiredNodeAffinityTerms": [{"matchExpressions": [fields]}]}


def _volume(**source: Any) -> dict[str, Any]:
    return {"spec.volumes": [{"name": "data", **source}]}


def _mount(**fields: Any) -> dict[str, Any]:
    return {"spec.volumes": DATA, "spec.volumeMounts": [{"name": "data", "mountPath": "/data", **fields}]}


TOLERATION = "spec.scheduling.tolerations[0]"
REQUIREMENT = "spec.scheduling.requiredNodeAffinityTerms[0].matchExpressions[0]"
VALUE_FROM = "spec.env[0].valueFrom"
LONG_PREFIX_KEY = "a" * 254 + "/key"

EMBEDDED_CASES: list[tuple[str, dict[str, Any], str, str | None]] = [
    # image
    ("image-blank", {"spec.image": " "}, "spec.image", "schema"),
    ("image-trailing-newline", {"spec.image": "trainer:1\n"}, "spec.image", "schema"),
    ("image-inner-space", {"spec.image": "trainer :1"}, "spec.image", "schema"),
    # quantities and capacities
    ("cpu-negative", {"spec.resources.cpu": "-1"}, "spec.resources.cpu", "schema"),
    ("cpu-explicit-plus-sign", {"spec.resources.cpu": "+4"}, "spec.resources.cpu", "schema"),
    ("memory-zero", {"spec.resources.memory": "0Gi"}, "spec.resources.memory", "schema"),
    ("hugepages-negative", {"spec.resources.hugepages2Mi": "-2Mi"}, "spec.resources.hugepages2Mi", "schema"),
    (
        "hugepages-not-whole-pages",
        {"spec.resources.hugepages2Mi": "3Mi"},
        "spec.resources.hugepages2Mi",
        "schema",
    ),
    ("shm-size-zero", {"spec.resources.shmSize": "0"}, "spec.resources.shmSize", "schema"),
    (
        "dynamic-capacity-zero",
        {"spec.checkpoint.storage.dynamic.capacity": "0"},
        "spec.checkpoint.storage.dynamic.capacity",
        "schema",
    ),
    (
        "dynamic-capacity-negative",
        {"spec.checkpoint.storage.dynamic.capacity": "-1Gi"},
        "spec.checkpoint.storage.dynamic.capacity",
        "schema",
    ),
    (
        "fsx-capacity-zero",
        {"spec.checkpoint.storage": {"fsxStatic": {**FSX, "capacity": "0.0Ti"}}},
        "spec.checkpoint.storage.fsxStatic.capacity",
        "schema",
    ),
    # names
    (
        "storage-class-not-a-dns-subdomain",
        {"spec.checkpoint.storage.dynamic.storageClassName": "Fast_SSD"},
        "spec.checkpoint.storage.dynamic.storageClassName",
        "schema",
    ),
    (
        "priority-class-not-a-name",
        {"spec.scheduling.priorityClassName": "high priority"},
        "spec.scheduling.priorityClassName",
        "schema",
    ),
    (
        "fsx-mount-name-with-a-slash",
        {"spec.checkpoint.storage": {"fsxStatic": {**FSX, "mountName": "a/b"}}},
        "spec.checkpoint.storage.fsxStatic.mountName",
        "schema",
    ),
    # integers: int32 fields have explicit bounds (Kubernetes does not enforce a CRD's int32 format)
    ("nodes-a-fraction", {"spec.nodes": 1.5}, "spec.nodes", "schema"),
    (
        "interval-steps-huge",
        {"spec.checkpoint.intervalSteps": BIG},
        "spec.checkpoint.intervalSteps",
        "schema",
    ),
    (
        "heartbeat-timeout-huge",
        {
            "spec.faultTolerance.heartbeatTimeoutSeconds": BIG,
            "spec.faultTolerance.initialHeartbeatTimeoutSeconds": BIG,
        },
        "spec.faultTolerance.heartbeatTimeoutSeconds",
        "schema",
    ),
    ("ttl-huge", {"spec.ttlSecondsAfterFinished": BIG}, "spec.ttlSecondsAfterFinished", "schema"),
    (
        "max-node-replacements-huge",
        {"spec.failurePolicy.maxNodeReplacements": BIG},
        "spec.failurePolicy.maxNodeReplacements",
        "schema",
    ),
    # failurePolicy rules and budgets
    (
        "rule-without-a-matcher",
        {"spec.failurePolicy.rules": [{"action": "FailJob"}]},
        "spec.failurePolicy.rules[0]",
        "cel",
    ),
    (
        "rule-with-two-matchers",
        {
            "spec.failurePolicy.rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {"operator": "In", "values": [3]},
                    "onFaultReasons": ["OOMKilled"],
                }
            ]
        },
        "spec.failurePolicy.rules[0]",
        "cel",
    ),
    (
        "rule-action-unknown",
        {"spec.failurePolicy.rules": [{"action": "Retry", "onFaultReasons": ["OOMKilled"]}]},
        "spec.failurePolicy.rules[0].action",
        "schema",
    ),
    (
        "rule-exit-code-zero",
        {
            "spec.failurePolicy.rules": [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}
            ]
        },
        "spec.failurePolicy.rules[0].onExitCodes.values[0]",
        "schema",
    ),
    (
        "rule-exit-code-operator-unknown",
        {
            "spec.failurePolicy.rules": [
                {"action": "Ignore", "onExitCodes": {"operator": "Gt", "values": [1]}}
            ]
        },
        "spec.failurePolicy.rules[0].onExitCodes.operator",
        "schema",
    ),
    (
        "rule-exit-codes-empty",
        {"spec.failurePolicy.rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": []}}]},
        "spec.failurePolicy.rules[0].onExitCodes.values",
        "schema",
    ),
    (
        "rule-disruption-reason-not-a-word",
        {"spec.failurePolicy.rules": [{"action": "Ignore", "onDisruptionReasons": ["Eviction By API"]}]},
        "spec.failurePolicy.rules[0].onDisruptionReasons[0]",
        "schema",
    ),
    (
        "rules-too-many",
        {"spec.failurePolicy.rules": [{"action": "Ignore", "onFaultReasons": ["OOMKilled"]}] * 17},
        "spec.failurePolicy.rules",
        "schema",
    ),
    (
        "budget-class-unknown",
        {"spec.failurePolicy.budgets": [{"faultClass": "Cosmic", "maxRestarts": 1}]},
        "spec.failurePolicy.budgets[0].faultClass",
        "schema",
    ),
    (
        "budget-class-twice",
        {
            "spec.failurePolicy.budgets": [
                {"faultClass": "NodeLoss", "maxRestarts": 1},
                {"faultClass": "NodeLoss", "maxRestarts": 2},
            ]
        },
        "spec.failurePolicy.budgets",
        "cel",
    ),
    (
        "budget-window-zero",
        {"spec.failurePolicy.budgets": [{"faultClass": "NodeLoss", "maxRestarts": 1, "windowSeconds": 0}]},
        "spec.failurePolicy.budgets[0].windowSeconds",
        "schema",
    ),
    (
        "max-backoff-below-backoff",
        {"spec.failurePolicy.backoffSeconds": 60, "spec.failurePolicy.maxBackoffSeconds": 30},
        "spec.failurePolicy.maxBackoffSeconds",
        "cel",
    ),
    (
        "barrier-timeout-huge",
        {"spec.faultTolerance.inProcess": {"barrierTimeoutSeconds": BIG}},
        "spec.faultTolerance.inProcess.barrierTimeoutSeconds",
        "schema",
    ),
    # env
    ("env-name-with-a-newline", _env(name="A\nB", value="1"), "spec.env[0].name", "schema"),
    ("env-name-with-equals", _env(name="A=B", value="1"), "spec.env[0].name", "schema"),
    ("env-name-starting-with-a-digit", _env(name="1A", value="1"), "spec.env[0].name", "schema"),
    ("env-name-starting-with-dot-dot", _env(name="..A", value="1"), "spec.env[0].name", "schema"),
    ("value-from-no-source", _value_from({}), VALUE_FROM, "cel"),
    (
        "value-from-two-sources",
        _value_from({"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}),
        VALUE_FROM,
        "cel",
    ),
    # An unknown source is an unknown field to parse_job; the API server prunes it (or refuses it under
    # strict field validation), and then valueFrom has no source.
    (
        "value-from-unknown-source",
        _value_from({"fileKeyRef": {"path": "a"}}),
        f"{VALUE_FROM}.fileKeyRef",
        None,
    ),
    (
        "field-ref-unknown-path",
        _value_from({"fieldRef": {"fieldPath": "spec.hostname"}}),
        f"{VALUE_FROM}.fieldRef.fieldPath",
        "schema",
    ),
    (
        "field-ref-label-key-malformed",
        _value_from({"fieldRef": {"fieldPath": "metadata.labels['a b']"}}),
        f"{VALUE_FROM}.fieldRef.fieldPath",
        "schema",
    ),
    (
        "field-ref-api-version-unknown",
        _value_from({"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}}),
        f"{VALUE_FROM}.fieldRef.apiVersion",
        "schema",
    ),
    (
        "resource-field-ref-unknown-resource",
        _value_from({"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}),
        f"{VALUE_FROM}.resourceFieldRef.resource",
        "schema",
    ),
    (
        "resource-field-ref-cpu-divisor-in-bytes",
        _value_from({"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1Ki"}}),
        f"{VALUE_FROM}.resourceFieldRef.divisor",
        "cel",
    ),
    (
        "config-map-key-with-a-slash",
        _value_from({"configMapKeyRef": {"name": "cm", "key": "a/b"}}),
        f"{VALUE_FROM}.configMapKeyRef.key",
        "schema",
    ),
    (
        "secret-name-not-a-dns-subdomain",
        _value_from({"secretKeyRef": {"name": "My_Secret", "key": "k"}}),
        f"{VALUE_FROM}.secretKeyRef.name",
        "schema",
    ),
    (
        "secret-key-missing",
        _value_from({"secretKeyRef": {"name": "s"}}),
        f"{VALUE_FROM}.secretKeyRef.key",
        "schema",
    ),
    # tolerations
    (
        "toleration-exists-with-a-value",
        _toleration(key="k", operator="Exists", value="v"),
        f"{TOLERATION}.value",
        "cel",
    ),
    ("toleration-empty-key-equal", _toleration(operator="Equal", value="v"), f"{TOLERATION}.operator", "cel"),
    (
        "toleration-seconds-without-no-execute",
        _toleration(key="k", operator="Exists", effect="NoSchedule", tolerationSeconds=5),
        f"{TOLERATION}.effect",
        "cel",
    ),
    (
        "toleration-key-malformed",
        _toleration(key="bad key", operator="Exists"),
        f"{TOLERATION}.key",
        "schema",
    ),
    (
        "toleration-key-prefix-too-long",
        _toleration(key=LONG_PREFIX_KEY, operator="Exists"),
        f"{TOLERATION}.key",
        "cel",
    ),
    (
        "toleration-operator-unknown",
        _toleration(key="k", operator="Gt", value="1"),
        f"{TOLERATION}.operator",
        "schema",
    ),
    (
        "toleration-value-not-a-label-value",
        _toleration(key="k", value="a b"),
        f"{TOLERATION}.value",
        "schema",
    ),
    (
        "toleration-seconds-negative",
        _toleration(key="k", operator="Exists", effect="NoExecute", tolerationSeconds=-1),
        f"{TOLERATION}.tolerationSeconds",
        "schema",
    ),
    # node affinity terms and node selector
    ("requirement-in-without-values", _requirement(key="k", operator="In"), f"{REQUIREMENT}.values", "cel"),
    (
        "requirement-exists-with-values",
        _requirement(key="k", operator="Exists", values=["a"]),
        f"{REQUIREMENT}.values",
        "cel",
    ),
    (
        "requirement-gt-not-an-integer",
        _requirement(key="k", operator="Gt", values=["ten"]),
        f"{REQUIREMENT}.values",
        "cel",
    ),
    ("requirement-key-malformed", _requirement(key="-k", operator="Exists"), f"{REQUIREMENT}.key", "schema"),
    (
        "requirement-key-prefix-too-long",
        _requirement(key=LONG_PREFIX_KEY, operator="Exists"),
        f"{REQUIREMENT}.key",
        "cel",
    ),
    (
        "affinity-term-without-requirements",
        {"spec.scheduling.requiredNodeAffinityTerms": [{"matchExpressions": []}]},
        "spec.scheduling.requiredNodeAffinityTerms[0].matchExpressions",
        "schema",
    ),
    (
        "node-selector-key-prefix-too-long",
        {"spec.scheduling.nodeSelector": {LONG_PREFIX_KEY: "x"}},
        "spec.scheduling.nodeSelector",
        "cel",
    ),
    (
        "node-selector-value-too-long",
        {"spec.scheduling.nodeSelector": {"team": "a" * 64}},
        "spec.scheduling.nodeSelector.team",
        "schema",
    ),
    # pod labels and annotations
    ("pod-label-key-name-too-long", {"spec.podLabels": {"a" * 64: "x"}}, "spec.podLabels", "cel"),
    ("pod-annotation-key-malformed", {"spec.podAnnotations": {"note!": "x"}}, "spec.podAnnotations", "cel"),
    # volumes
    ("volume-without-a-source", _volume(), "spec.volumes[0]", "cel"),
    (
        "volume-with-two-sources",
        _volume(emptyDir={}, persistentVolumeClaim={"claimName": "c"}),
        "spec.volumes[0]",
        "cel",
    ),
    ("volume-names-duplicate", {"spec.volumes": DATA + DATA}, "spec.volumes", "cel"),
    (
        "config-map-item-path-backstep",
        _volume(configMap={"name": "cm", "items": [{"key": "k", "path": "a/../../etc"}]}),
        "spec.volumes[0].configMap.items[0].path",
        "cel",
    ),
    (
        "config-map-item-path-absolute",
        _volume(configMap={"name": "cm", "items": [{"key": "k", "path": "/etc/k"}]}),
        "spec.volumes[0].configMap.items[0].path",
        "schema",
    ),
    (
        "secret-default-mode-too-high",
        _volume(secret={"secretName": "s", "defaultMode": 0o1000}),
        "spec.volumes[0].secret.defaultMode",
        "schema",
    ),
    (
        "host-path-backstep",
        _volume(hostPath={"path": "/data/../etc"}),
        "spec.volumes[0].hostPath.path",
        "cel",
    ),
    (
        "host-path-type-unknown",
        _volume(hostPath={"path": "/d", "type": "Dir"}),
        "spec.volumes[0].hostPath.type",
        "schema",
    ),
    (
        "empty-dir-size-limit-negative",
        _volume(emptyDir={"sizeLimit": "-1Gi"}),
        "spec.volumes[0].emptyDir.sizeLimit",
        "schema",
    ),
    (
        "empty-dir-medium-unknown",
        _volume(emptyDir={"medium": "Tape"}),
        "spec.volumes[0].emptyDir.medium",
        "schema",
    ),
    (
        "nfs-path-relative",
        _volume(nfs={"server": "nfs", "path": "export"}),
        "spec.volumes[0].nfs.path",
        "schema",
    ),
    ("csi-driver-malformed", _volume(csi={"driver": "my_driver"}), "spec.volumes[0].csi.driver", "schema"),
    (
        "claim-name-empty",
        _volume(persistentVolumeClaim={"claimName": ""}),
        "spec.volumes[0].persistentVolumeClaim.claimName",
        "schema",
    ),
    # volume mounts
    (
        "checkpoint-mount-path-over-dev-shm",
        {"spec.checkpoint.mountPath": "/dev/shm"},
        "spec.checkpoint.mountPath",
        "cel",
    ),
    ("mount-path-relative", _mount(mountPath="data"), "spec.volumeMounts[0].mountPath", "schema"),
    (
        "mount-paths-duplicate",
        {"spec.volumes": DATA, "spec.volumeMounts": [{"name": "data", "mountPath": "/d"}] * 2},
        "spec.volumeMounts",
        "cel",
    ),
    ("mount-sub-path-backstep", _mount(subPath="a/.."), "spec.volumeMounts[0].subPath", "cel"),
    ("mount-sub-path-absolute", _mount(subPath="/a"), "spec.volumeMounts[0].subPath", "schema"),
    (
        "mount-sub-path-and-expression",
        _mount(subPath="a", subPathExpr="$(POD_NAME)"),
        "spec.volumeMounts[0].subPathExpr",
        "cel",
    ),
    (
        "mount-propagation-bidirectional",
        _mount(mountPropagation="Bidirectional"),
        "spec.volumeMounts[0].mountPropagation",
        "schema",
    ),
    (
        "mount-recursive-read-only-not-read-only",
        _mount(recursiveReadOnly="Enabled"),
        "spec.volumeMounts[0].recursiveReadOnly",
        "cel",
    ),
]
CASES += EMBEDDED_CASES


def _job_with(changes: dict[str, Any]) -> dict[str, Any]:
    job = valid_job()
    for path, value in changes.items():
        _set(job, path, value if value is _DELETE else copy.deepcopy(value))
    return job


def test_the_base_job_is_valid_for_both() -> None:
    api.parse_job(valid_job())
    assert crd_errors(valid_job()) == []


def test_there_are_at_least_25_cases() -> None:
    assert len(CASES) >= 25
    assert sum(1 for case in CASES if case[3] == "cel") >= 10


def test_at_least_40_cases_cover_the_embedded_kubernetes_types() -> None:
    refused_at_apply = [case for case in EMBEDDED_CASES if case[3]]
    assert len(refused_at_apply) >= 40
    fields = " ".join(case[2] for case in refused_at_apply)
    for kind in ("image", "env", "valueFrom", "volumes", "volumeMounts", "tolerations", "nodeSelector",
                 "matchExpressions", "resources", "capacity", "storageClassName", "priorityClassName",
                 "podLabels", "podAnnotations"):  # fmt: skip
        assert kind in fields, kind


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
    ("spec.faultTolerance.launcher", "Supervisor"),
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


def test_a_whole_float_is_an_integer_for_both() -> None:
    # The API server's schema check takes 2.0 for an integer (and stores 2): so does parse_job.
    job = _job_with(
        {"spec.nodes": 2.0, "spec.rendezvous.port": 29500.0, "spec.terminationGracePeriodSeconds": 30.0}
    )
    assert crd_errors(job) == []
    spec = api.parse_job(job).spec
    assert (spec.nodes, spec.rendezvous.port, spec.termination_grace_period_seconds) == (2, 29500, 30)
    assert isinstance(spec.nodes, int)


def test_launcher_and_memory_tier_defaults() -> None:
    spec = api.parse_job(valid_job()).spec
    assert spec.fault_tolerance.launcher is api.Launcher.FT_LAUNCHER
    assert spec.checkpoint.memory_interval_steps == 1
    assert crd_errors(valid_job()) == []


def test_a_supervisor_job_with_in_process_restarts_and_the_memory_tier_off_is_valid_for_both() -> None:
    job = _job_with(
        {
            "spec.faultTolerance.launcher": "Supervisor",
            "spec.checkpoint.memoryIntervalSteps": 0,
            "spec.rendezvous.port": 65534,
            "spec.hotSpares": 1,
        }
    )
    spec = api.parse_job(job).spec
    assert spec.fault_tolerance.launcher is api.Launcher.SUPERVISOR
    assert spec.checkpoint.memory_interval_steps == 0
    assert crd_errors(job) == []


def test_the_supervisor_message_names_the_field_it_needs() -> None:
    job = _job_with(
        {"spec.faultTolerance.launcher": "Supervisor", "spec.faultTolerance.inProcess": {"enabled": False}}
    )
    with pytest.raises(api.JobValidationError, match=r"spec\.faultTolerance\.launcher: .*inProcess\.enabled"):
        api.parse_job(job)
