"""The `kubernetes-only` mode of `rtj bench goodput`: the same training as a hand-rolled Indexed Job.

What a user without the operator writes, and what Kubernetes alone then does with each fault:

- a batch/v1 Job with `completionMode: Indexed`, `completions = parallelism = nodes`, and a headless
  Service; the pods are the operator's own worker pod (`rtj_operator.render`, so the trainer, its
  image, resources, volumes and hardening are identical) with what the Job controller gives instead
  of the operator: the node rank is the pod's completion index (the downward API reads the
  `batch.kubernetes.io/job-completion-index` annotation), the rendezvous host is index 0's
  hostname `<job>-0.<service>.<ns>.svc` (an Indexed Job names its pods' hosts `<job>-<index>`;
  `subdomain` is the Service), and the rendezvous id is the Job's uid;
- `restartPolicy: Never` with a `backoffLimit` (the Job API's default pairing, and the one
  Kubernetes' documentation uses for Indexed Jobs whose pods talk to each other): a failed pod is
  recreated, same index, by the Job controller, after its exponential back-off (10 s after the first
  failure, doubling per failure since the last success, at most 10 minutes: kube-controller-manager's
  `DefaultJobPodFailureBackOff` / `MaxJobPodFailureBackOff`). A `podFailurePolicy` rule ignores
  failures with the `DisruptionTarget` condition (a lost node, a preemption) so they do not spend the
  budget: the rule Kubernetes' documentation gives for this. `backoffLimit` is the job's
  `failurePolicy.maxNodeReplacements`, the budget the operator would have spent;
- the checkpoint claim, the ServiceAccount and the Service as the renderer makes them, without the
  operator's owner, labels and node-loss tolerations: Kubernetes' DefaultTolerationSeconds admission
  then gives each pod its 300 s on a NotReady or unreachable node.

The job spec is the example job's with in-process restart off and `maxInJobRestarts: 0`, so every
fault fails a pod and Kubernetes is the only layer that recovers it. The local cluster's real
kube-controller-manager runs the Job controller and pod GC.

A lost node: on EKS the machine's end is followed by the cloud node lifecycle controller deleting the
Node object (it checks NotReady nodes every 5 s, its `--node-monitor-period`, and deletes those
whose instance is gone), then pod GC deletes the Node's pods (after a 40 s quarantine, in a loop
that runs every 20 s), then the Job controller recreates the pod. Here the node is killed, the node
lifecycle controller marks it NotReady after the cluster's grace period, and `IndexedJob.tick`
deletes the Node object `CLOUD_NODE_DELETE_SECONDS` later, as the cloud controller would; the rest
is the controller manager's own. On EKS the grace period is 40-50 s instead of this cluster's few
seconds (docs/benchmarks.md).

The recoveries come from the pods themselves: every pod the Job controller created for an index after
its first one is a recovery by the Job controller (`report.LAYER_JOB_CONTROLLER`) at the pod's
creation time. Progress and faults are read as for every mode: the trainer's progress file and fault
markers in the checkpoint volume (`rehearsal.run_job`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rtj_contract import env as env_names
from rtj_operator import constants, names
from rtj_operator.api import parse_job
from rtj_operator.render import NODE_LOSS_TAINTS, render_base, render_worker_pod

from rtj_demo.rehearsal import NAMESPACE, Stack
from rtj_demo.report import LAYER_JOB_CONTROLLER, RecoveryRecord
from rtj_demo.timeline import record_epoch_seconds

# What the Job controller sets on its pods (Kubernetes' names).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# The renderer writes owner references to the ResilientTrainingJob; this stands in for its uid and
# every owner reference is removed (nothing of the operator's remains).
RENDER_UID = "00000000-0000-0000-0000-000000000000"
# The cloud node lifecycle controller's period (`--node-monitor-period`, 5 s): how long after a
# terminated instance's node turns NotReady its Node object is deleted, at the most.
CLOUD_NODE_DELETE_SECONDS = 5.0
# kube-controller-manager's pod failure back-off of the Job controller and pod GC's timings
# (pkg/controller/job, pkg/controller/podgc): constants there, not flags.
JOB_POD_FAILURE_BACKOFF_SECONDS = 10.0
JOB_MAX_POD_FAILURE_BACKOFF_SECONDS = 600.0
POD_GC_ORPHAN_SECONDS = 40.0 + 2 * 20.0  # quarantine, then up to two runs of its 20 s loop

_OPERATOR_LABEL_PREFIX = f"{constants.GROUP}/"


def rendezvous_host(job: str, namespace: str) -> str:
    """Index 0's DNS name: an Indexed Job's pod is host `<job>-<index>` of its `subdomain` Service."""
    return f"{job}-0.{names.service_name(job)}.{namespace}.svc"


def _without_operator(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata without the operator's owner references and labels."""
    meta = copy.deepcopy(dict(metadata))
    meta.pop("ownerReferences", None)
    labels = {
        k: v
        for k, v in (meta.get("labels") or {}).items()
        if not k.startswith(_OPERATOR_LABEL_PREFIX) and k != constants.LABEL_MANAGED_BY
    }
    meta["labels"] = labels
    return meta


def _job_selector(job: str) -> dict[str, str]:
    return {JOB_NAME_LABEL: job}


def _reselect_affinity(affinity: Mapping[str, Any], job: str) -> dict[str, Any]:
    """The renderer's pod (anti-)affinity terms, selecting the Job's pods instead of the operator's."""
    out = copy.deepcopy(dict(affinity))
    for kind in ("podAffinity", "podAntiAffinity"):
        for term in (out.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
            term["labelSelector"] = {"matchLabels": _job_selector(job)}
    return out


def _downward(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def _hand_rolled_env(env: Iterable[Mapping[str, Any]], job: str, namespace: str) -> list[dict[str, Any]]:
    """The rendered contract with the Job controller's identity: rank = completion index, the
    rendezvous at index 0's hostname, the rendezvous id = the Job's uid."""
    replaced: dict[str, dict[str, Any]] = {
        env_names.NODE_RANK: {
            "valueFrom": _downward(f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']")
        },
        env_names.RDZV_HOST: {"value": rendezvous_host(job, namespace)},
        env_names.JOB_UID: {"valueFrom": _downward(f"metadata.labels['{CONTROLLER_UID_LABEL}']")},
    }
    out: list[dict[str, Any]] = []
    for var in env:
        name = str(var["name"])
        out.append({"name": name, **replaced.pop(name)} if name in replaced else dict(var))
    out += [{"name": name, **value} for name, value in replaced.items()]
    return out


def _pod_template(rtj: Any, job: str, namespace: str) -> dict[str, Any]:
    pod = render_worker_pod(rtj, 0, uid=RENDER_UID)
    spec = copy.deepcopy(pod["spec"])
    spec.pop("hostname", None)  # the Job controller names each pod's host `<job>-<index>`
    spec["subdomain"] = names.service_name(job)
    spec["restartPolicy"] = "Never"
    spec["affinity"] = _reselect_affinity(spec.get("affinity") or {}, job)
    # The operator's short tolerations of a lost node go: Kubernetes' defaults (300 s) apply.
    tolerations = [t for t in spec.get("tolerations") or [] if t.get("key") not in NODE_LOSS_TAINTS]
    if tolerations:
        spec["tolerations"] = tolerations
    else:
        spec.pop("tolerations", None)
    for container in spec["containers"]:
        container["env"] = _hand_rolled_env(container.get("env") or [], job, namespace)
    meta = _without_operator(pod["metadata"])
    meta.pop("name", None)
    meta.pop("namespace", None)
    return {"metadata": meta, "spec": spec}


def indexed_job_objects(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The hand-rolled job for a ResilientTrainingJob manifest, in creation order: the renderer's
    ServiceAccount, checkpoint storage and headless Service, then the Indexed Job (pure)."""
    body = copy.deepcopy(dict(manifest))
    body.setdefault("metadata", {})["uid"] = RENDER_UID
    rtj = parse_job(body)
    job, namespace = rtj.name, rtj.namespace
    objects: list[dict[str, Any]] = []
    for child in render_base(rtj, uid=RENDER_UID):
        if child["kind"] not in ("ServiceAccount", "PersistentVolumeClaim", "PersistentVolume", "Service"):
            raise ValueError(
                f"the kubernetes-only mode has no {child['kind']} (spec.disruption, spec.scheduling)"
            )
        adapted = {**child, "metadata": _without_operator(child["metadata"])}
        if adapted["kind"] == "Service":
            adapted["spec"] = {**adapted["spec"], "selector": _job_selector(job)}
        objects.append(adapted)
    nodes = rtj.spec.nodes
    objects.append(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job,
                "namespace": namespace,
                "labels": {constants.LABEL_APP_NAME: constants.APP_NAME},
            },
            "spec": {
                "completionMode": "Indexed",
                "completions": nodes,
                "parallelism": nodes,
                "backoffLimit": rtj.spec.failure_policy.max_node_replacements,
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                        }
                    ]
                },
                "template": _pod_template(rtj, job, namespace),
            },
        }
    )
    return objects


@dataclass(frozen=True)
class SeenPod:
    """A pod of the Job, as the follower saw it: its name, completion index and creation time."""

    name: str
    index: int
    created: float


def recoveries_from_pods(pods: Iterable[SeenPod]) -> list[RecoveryRecord]:
    """Every pod created for an index after that index's first pod: the Job controller recreated it."""
    by_index: dict[int, list[SeenPod]] = {}
    for pod in pods:
        by_index.setdefault(pod.index, []).append(pod)
    out = [
        RecoveryRecord(time=pod.created, layer=LAYER_JOB_CONTROLLER)
        for seen in by_index.values()
        for pod in sorted(seen, key=lambda p: (p.created, p.name))[1:]
    ]
    return sorted(out, key=lambda r: r.time)


def job_state(status: Mapping[str, Any]) -> str:
    """Succeeded / Failed from the Job's terminal conditions, else Running (pods active) or Pending."""
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "Succeeded"
        if condition.get("type") == "Failed":
            return "Failed"
    return "Running" if int(status.get("active") or 0) > 0 else "Pending"


def backoff_allowance_seconds(faults: int, nodes: int, node_losses: int) -> float:
    """The longest the Job controller's back-off and pod GC may add to a run: each fault fails every
    pod (the survivors lose their peers), and the delay before the recreation doubles per failure."""
    total, failures = 0.0, 0
    for _ in range(faults):
        failures += nodes
        delay = JOB_POD_FAILURE_BACKOFF_SECONDS * 2 ** (failures - 1)
        total += min(delay, JOB_MAX_POD_FAILURE_BACKOFF_SECONDS)
    return total + node_losses * (CLOUD_NODE_DELETE_SECONDS + POD_GC_ORPHAN_SECONDS)


def _condition_message(status: Mapping[str, Any], kind: str) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return f"{condition.get('reason', '')}: {condition.get('message', '')}"
    return ""


class IndexedJob:
    """Runs and follows the hand-rolled Indexed Job (a `rehearsal.JobDriver`)."""

    def __init__(self, stack: Stack, name: str) -> None:
        from kubernetes import client

        self.stack = stack
        self.name = name
        self.label_selector = f"{JOB_NAME_LABEL}={name}"
        self.batch = client.BatchV1Api(stack.api)
        self.pods: dict[str, SeenPod] = {}
        self.objects: list[dict[str, Any]] = []
        # Killed nodes whose Node object is still there: name -> when it was first seen NotReady.
        self._lost: dict[str, float | None] = {}

    def submit(self, manifest: Mapping[str, Any]) -> list[str]:
        self.objects = indexed_job_objects(manifest)
        # As a user would: `kubectl create` of the manifests.
        items = {"apiVersion": "v1", "kind": "List", "items": self.objects}
        self.stack.kubectl("create", "-f", "-", input_text=json.dumps(items))
        job = self.objects[-1]["spec"]
        return [
            f"a batch/v1 Indexed Job: restartPolicy Never, backoffLimit {job['backoffLimit']}, "
            "DisruptionTarget failures ignored; no operator"
        ]

    def poll(self) -> tuple[str, dict[str, Any]]:
        job = self.batch.read_namespaced_job(self.name, NAMESPACE)
        status: dict[str, Any] = self.stack.api.sanitize_for_serialization(job.status) or {}
        self._see_pods()
        return job_state(status), status

    def _list_pods(self) -> list[dict[str, Any]]:
        items = self.stack.core.list_namespaced_pod(NAMESPACE, label_selector=self.label_selector).items
        return [self.stack.api.sanitize_for_serialization(p) for p in items]

    def _see_pods(self) -> None:
        for pod in self._list_pods():
            meta = pod.get("metadata") or {}
            index = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
            created = record_epoch_seconds(meta.get("creationTimestamp"))
            if meta.get("name") and index is not None and created is not None:
                self.pods.setdefault(meta["name"], SeenPod(meta["name"], int(index), created))

    def slot_node(self, slot: int) -> str | None:
        """An Indexed Job has no spares: slot i is index i."""
        return self.worker_node(slot)

    def worker_node(self, index: int) -> str | None:
        for pod in self._list_pods():
            meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
            if (
                (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION) == str(index)
                and not meta.get("deletionTimestamp")
                and status.get("phase") not in ("Succeeded", "Failed")
                and spec.get("nodeName")
            ):
                return str(spec["nodeName"])
        return None

    def lose_node(self, node: str, on_note: Callable[[str], None]) -> None:
        self.stack.cluster.kill_node(node)
        self._lost[node] = None

    def tick(self, on_note: Callable[[str], None]) -> None:
        """Delete a lost node's Node object once it has been NotReady for CLOUD_NODE_DELETE_SECONDS."""
        for node, not_ready_since in list(self._lost.items()):
            if not_ready_since is None:
                if self.stack.cluster.node_ready_status(node) != "True":
                    self._lost[node] = time.monotonic()
                    on_note(f"node {node} is NotReady (node lifecycle controller)")
                continue
            if time.monotonic() - not_ready_since >= CLOUD_NODE_DELETE_SECONDS:
                self.stack.cluster.delete_node(node)
                del self._lost[node]
                on_note(f"node {node}: Node object deleted, as the cloud node lifecycle controller does")

    def events(self) -> list[dict[str, Any]]:
        self._see_pods()
        return self.stack.job_events(self.name)

    def recoveries(self, events: Sequence[Mapping[str, Any]]) -> list[RecoveryRecord]:
        return recoveries_from_pods(self.pods.values())

    def end_message(self, state: str, status: Mapping[str, Any]) -> str:
        return _condition_message(status, "Complete" if state == "Succeeded" else "Failed")


def delete_indexed_job(stack: Stack, name: str, timeout: float = 180) -> None:
    """Delete the Job, its pods and the objects made beside it (Service, ServiceAccount, claim)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    batch = client.BatchV1Api(stack.api)
    core = stack.core
    with contextlib.suppress(ApiException):
        batch.delete_namespaced_job(name, NAMESPACE, propagation_policy="Background")
    deadline = time.monotonic() + timeout
    selector = f"{JOB_NAME_LABEL}={name}"
    while core.list_namespaced_pod(NAMESPACE, label_selector=selector).items:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pods of Job {name} were not deleted within {timeout:.0f} s")
        time.sleep(1.0)
    with contextlib.suppress(ApiException):
        core.delete_namespaced_service(names.service_name(name), NAMESPACE)
    with contextlib.suppress(ApiException):
        core.delete_namespaced_service_account(names.trainer_name(name), NAMESPACE)
    with contextlib.suppress(ApiException):
        core.delete_namespaced_persistent_volume_claim(names.pvc_name(name), NAMESPACE)
