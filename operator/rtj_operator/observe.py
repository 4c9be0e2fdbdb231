"""Turn Kubernetes API objects (plain dicts) into the observations the decisions are made on.

`runtime.job_pass` gathers a job's body, its pods and the nodes (from kopf's indexes or fresh reads) and
calls `observe_job` and `observe` here; the decisions (`rtj_operator.decide`) only ever see these frozen
dataclasses, never API objects. What is wrong with a worker's node is judged from them in
`rtj_operator.decide.node_problems`.

Pure: no I/O, time passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj_contract import termination
from rtj_contract.times import parse_rfc3339

from rtj_operator import api, constants, names
from rtj_operator.fsx_policy import FsxAllowList
from rtj_operator.nodehealth import (
    NodeHealth,
)
from rtj_operator.progress import ProgressReport, RestartOffset

# A container's termination message is kept up to this many characters (the kubelet keeps 4 KiB; a
# condition's message is read by people, and the status must stay small).
MAX_TERMINATION_MESSAGE_CHARS = 1024
# Waiting reasons that are steps of a normal start, not a problem worth reporting.
NORMAL_WAITING_REASONS = frozenset({"", "ContainerCreating", "PodInitializing"})


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str
    time_added: datetime | None


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str
    seconds: int | None

    def matches(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class NodeCondition:
    """A node condition other than Ready (node-problem-detector's, the EKS agent's, ...)."""

    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class NodeState:
    name: str
    ready: str  # "True", "False" or "Unknown" (a node without a Ready condition reads "Unknown")
    ready_since: datetime | None  # the Ready condition's lastTransitionTime
    taints: tuple[Taint, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)  # resource name -> quantity
    unschedulable: bool = False  # spec.unschedulable (cordoned)
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)  # by type, Ready left out


@dataclass(frozen=True)
class PodState:
    name: str
    uid: str
    role: str  # constants.ROLE_WORKER, ROLE_SPARE, ROLE_SURGE (a worker's index) or ROLE_STORE (index 0)
    index: int
    node_name: str
    phase: str
    ready: bool
    deleting: bool
    deletion_grace_seconds: int | None
    disruption: str | None  # the DisruptionTarget condition's reason, if the condition is True
    status_reason: str  # status.reason, e.g. "Evicted"
    # status.message and, for a container that exited non-zero, its exit code, reason and
    # termination message (state.terminated, else lastState.terminated).
    message: str
    # Why a container cannot start (ErrImagePull, CreateContainerConfigError, ...), with its message.
    waiting: str
    created: datetime | None
    restart_count_annotation: int | None  # the podReplacement count the pod was created under
    tolerations: tuple[Toleration, ...]
    report: ProgressReport | None
    # The whole-number resources its containers request (extended resources such as nvidia.com/gpu
    # and vpc.amazonaws.com/efa are integers by API rule): resource name -> the sum over containers.
    requests: Mapping[str, int] = field(default_factory=dict)
    # The failed container's exit code and fault reason (`container_fault`), for the failure policy,
    # and its termination message without the fault reason line (`fault_detail`), on one line.
    exit_code: int | None = None
    fault_reason: str = ""
    fault_detail: str = ""


@dataclass(frozen=True)
class Observed:
    """What the operator sees of one job's world at one moment."""

    pods: tuple[PodState, ...]
    nodes: Mapping[str, NodeState]
    # Whether the base children (Service, storage, RBAC) must be (re)asserted on this pass even if no
    # worker is being created: set on job create/update/resume, not on every pod or node event.
    ensure_base: bool = False
    # In-memory offsets of the trainer's restart counters, keyed by pod uid (see progress.fold_progress).
    offsets: Mapping[str, RestartOffset] = field(default_factory=dict)
    # When the API server last refused one of the job's children (in memory; see decide.admission).
    refused_at: datetime | None = None
    # The operator's settings for judging nodes beyond Ready (see nodehealth).
    health: NodeHealth = field(default_factory=NodeHealth)
    # The FSx file systems each namespace may mount (the operator's setting; empty: none).
    fsx_allowed: FsxAllowList = field(default_factory=FsxAllowList)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


# The newest NodeState made of each node, with the version it was made of (uid and resourceVersion:
# names and revisions repeat across clusters and across a node's deletion): a pass observes every
# node of the cluster, and most have not changed since the last pass (1,100 nodes, 100 jobs).
_NODES_SEEN: dict[str, tuple[tuple[str, str], NodeState]] = {}


def observe_node(body: Mapping[str, Any]) -> NodeState:
    """What the operator sees of a node; made once per version of the node (a body without a uid and
    resourceVersion is always read anew)."""
    metadata = _mapping(body.get("metadata"))
    name = _str(metadata.get("name"))
    version = (_str(metadata.get("uid")), _str(metadata.get("resourceVersion")))
    seen = _NODES_SEEN.get(name)
    if all(version) and seen is not None and seen[0] == version:
        return seen[1]
    state = _read_node(body)
    if all(version) and name:
        _NODES_SEEN[name] = (version, state)
    return state


def forget_node(name: str) -> None:
    _NODES_SEEN.pop(name, None)


def _read_node(body: Mapping[str, Any]) -> NodeState:
    metadata, spec, status = (
        _mapping(body.get("metadata")),
        _mapping(body.get("spec")),
        _mapping(body.get("status")),
    )
    ready, since = "Unknown", None
    conditions: dict[str, NodeCondition] = {}
    for condition in map(_mapping, _list(status.get("conditions"))):
        kind = _str(condition.get("type"))
        if kind == "Ready":
            ready = _str(condition.get("status")) or "Unknown"
            since = parse_rfc3339(condition.get("lastTransitionTime"))
        elif kind:
            conditions[kind] = NodeCondition(
                _str(condition.get("status")), _str(condition.get("reason")), _str(condition.get("message"))
            )
    taints = tuple(
        Taint(
            key=_str(t.get("key")),
            value=_str(t.get("value")),
            effect=_str(t.get("effect")),
            time_added=parse_rfc3339(t.get("timeAdded")),
        )
        for t in map(_mapping, _list(spec.get("taints")))
    )
    return NodeState(
        name=_str(metadata.get("name")),
        ready=ready,
        ready_since=since,
        taints=taints,
        labels={str(k): _str(v) for k, v in _mapping(metadata.get("labels")).items()},
        allocatable={str(k): str(v) for k, v in _mapping(status.get("allocatable")).items()},
        unschedulable=bool(spec.get("unschedulable")),
        conditions=conditions,
    )


def _whole_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Per resource, the sum of the containers' whole-number requests (limits where no request)."""
    total: dict[str, int] = {}
    for container in map(_mapping, _list(spec.get("containers"))):
        resources = _mapping(container.get("resources"))
        wanted = {**_mapping(resources.get("limits")), **_mapping(resources.get("requests"))}
        for name, value in wanted.items():
            text = str(value).strip()
            if text.isdigit():
                total[str(name)] = total.get(str(name), 0) + int(text)
    return total


def observe_pod(body: Mapping[str, Any], report: ProgressReport | None = None) -> PodState | None:
    """A pod of a job (worker, spare, surge or store), or None for a pod that is none of the job's.

    `report` is the pod's newest progress report, read from its progress endpoint
    (`runtime.scrape`), if any."""
    metadata, spec, status = (
        _mapping(body.get("metadata")),
        _mapping(body.get("spec")),
        _mapping(body.get("status")),
    )
    labels, annotations = _mapping(metadata.get("labels")), _mapping(metadata.get("annotations"))
    role = _str(labels.get(constants.LABEL_ROLE))
    name = _str(metadata.get("name"))
    if role == constants.ROLE_WORKER:
        index_text = _str(labels.get(constants.LABEL_WORKER_INDEX))
    elif role in (constants.ROLE_SPARE, constants.ROLE_SURGE):
        index_text = name.rpartition("-")[2]
    elif role == constants.ROLE_STORE:
        index_text = "0"
    else:
        return None
    if not index_text.isdigit():
        return None
    ready, disruption = False, None
    for condition in map(_mapping, _list(status.get("conditions"))):
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            ready = True
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            disruption = _str(condition.get("reason")) or "Disrupted"
    containers = [_mapping(c) for c in _list(status.get("containerStatuses"))]
    exits = [m for m in map(_exit_message, containers) if m]
    message = "; ".join(m for m in (_str(status.get("message")), *exits) if m)
    waiting = "; ".join(m for m in map(_waiting_message, containers) if m)
    failed = next((c for c in containers if container_fault(c)[0] is not None), None)
    exit_code, fault_reason = container_fault(failed) if failed is not None else (None, "")
    tolerations = tuple(
        Toleration(
            key=_str(t.get("key")),
            operator=_str(t.get("operator")) or "Equal",
            value=_str(t.get("value")),
            effect=_str(t.get("effect")),
            seconds=t.get("tolerationSeconds") if isinstance(t.get("tolerationSeconds"), int) else None,
        )
        for t in map(_mapping, _list(spec.get("tolerations")))
    )
    restart_count = _str(annotations.get(constants.ANNOTATION_RESTART_COUNT))
    grace = metadata.get("deletionGracePeriodSeconds")
    return PodState(
        name=name,
        uid=_str(metadata.get("uid")),
        role=role,
        index=int(index_text),
        node_name=_str(spec.get("nodeName")),
        phase=_str(status.get("phase")) or "Pending",
        ready=ready,
        deleting=bool(metadata.get("deletionTimestamp")),
        deletion_grace_seconds=grace if isinstance(grace, int) else None,
        disruption=disruption,
        status_reason=_str(status.get("reason")),
        message=message,
        waiting=waiting,
        created=parse_rfc3339(metadata.get("creationTimestamp")),
        restart_count_annotation=int(restart_count) if restart_count.isdigit() else None,
        tolerations=tolerations,
        report=report,
        requests=_whole_requests(spec),
        exit_code=exit_code,
        fault_reason=fault_reason,
        fault_detail=fault_detail(failed) if failed is not None else "",
    )


def _clip(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_TERMINATION_MESSAGE_CHARS:
        return text
    return text[: MAX_TERMINATION_MESSAGE_CHARS - 3] + "..."


def _exit_message(container: Mapping[str, Any]) -> str:
    """`container C exited with code N (Reason): message` for a non-zero exit, else ''."""
    for state in (container.get("state"), container.get("lastState")):
        terminated = _mapping(_mapping(state).get("terminated"))
        code = terminated.get("exitCode")
        if not terminated or code in (None, 0):
            continue
        text = f"container {_str(container.get('name'))} exited with code {code}"
        reason = _str(terminated.get("reason"))
        if reason:
            text += f" ({reason})"
        detail = _clip(_str(terminated.get("message")))
        return f"{text}: {detail}" if detail else text
    return ""


def container_fault(container: Mapping[str, Any]) -> tuple[int | None, str]:
    """(exit code, fault reason) of a container that exited non-zero, else (None, "").

    The fault reason is the trainer's own, from a line `FaultReason: <Reason>` of its termination
    message, else the runtime's termination reason (OOMKilled, Error, ...).
    """
    for state in (container.get("state"), container.get("lastState")):
        terminated = _mapping(_mapping(state).get("terminated"))
        code = terminated.get("exitCode")
        if not isinstance(code, int) or code == 0:
            continue
        message = _str(terminated.get("message"))
        return code, termination.fault_reason(message) or _str(terminated.get("reason"))
    return None, ""


def fault_detail(container: Mapping[str, Any]) -> str:
    """The termination message of a container that exited non-zero, without its `FaultReason:` line,
    on one line and clipped; '' when it has none."""
    for state in (container.get("state"), container.get("lastState")):
        terminated = _mapping(_mapping(state).get("terminated"))
        code = terminated.get("exitCode")
        if not isinstance(code, int) or code == 0:
            continue
        text = termination.FAULT_REASON_LINE.sub("", _str(terminated.get("message")))
        return _clip(" ".join(text.split()))
    return ""


def _waiting_message(container: Mapping[str, Any]) -> str:
    """`container C waiting: Reason: message` when a container cannot start, else ''."""
    waiting = _mapping(_mapping(container.get("state")).get("waiting"))
    reason = _str(waiting.get("reason"))
    if not waiting or reason in NORMAL_WAITING_REASONS:
        return ""
    detail = _clip(_str(waiting.get("message")))
    text = f"container {_str(container.get('name'))} waiting: {reason}"
    return f"{text}: {detail}" if detail else text


def observe(  # noqa: PLR0913 - keyword-only after the two observations, each a named field
    pods: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    *,
    ensure_base: bool = False,
    offsets: Mapping[str, RestartOffset] | None = None,
    refused_at: datetime | None = None,
    health: NodeHealth | None = None,
    fsx_allowed: FsxAllowList | None = None,
    reports: Mapping[str, ProgressReport] | None = None,
) -> Observed:
    """What the operator sees of one job; `reports` are the pods' progress reports by pod uid."""
    known = reports or {}
    pod_states = tuple(
        p
        for p in (
            observe_pod(body, known.get(_str(_mapping(body.get("metadata")).get("uid")))) for body in pods
        )
        if p is not None
    )
    node_states = {n.name: n for n in (observe_node(body) for body in nodes) if n.name}
    return Observed(
        pods=pod_states,
        nodes=node_states,
        ensure_base=ensure_base,
        offsets=dict(offsets or {}),
        refused_at=refused_at,
        health=health or NodeHealth(),
        fsx_allowed=fsx_allowed or FsxAllowList(),
    )


@dataclass(frozen=True)
class FailurePolicy:
    node_loss_grace_seconds: int = 10
    max_node_replacements: int = 10
    backoff_seconds: int = 5
    repeat_offender_threshold: int = 2
    taint_excluded_nodes: bool = False


@dataclass(frozen=True)
class JobView:
    """What the decisions need of a valid job: identity, the spec fields they act on, status, and the
    parsed job itself (`model`), from which `rtj_operator.render` renders its children."""

    name: str
    namespace: str
    uid: str
    generation: int
    nodes: int
    hot_spares: int
    suspend: bool
    ttl_seconds_after_finished: int | None
    retention_delete: bool
    policy: FailurePolicy
    status: Mapping[str, Any]
    model: api.ResilientTrainingJob

    def pod_name(self, role: str, index: int) -> str:
        return names.pod_name(self.name, role, index)

    @property
    def spares_in_training(self) -> bool:
        """Whether the hot spares take part in the training (Supervisor's reserve ranks, FtLauncher's
        standby nodes): a spare is then never given up for a replacement, and a gang restart recreates
        the spares with the store pod."""
        return api.spares_in_training(self.model.spec)

    @property
    def store_pod(self) -> bool:
        """Whether the job runs a store pod (Supervisor's, or FtLauncher's with rendezvous.host StorePod)."""
        return api.has_store_pod(self.model.spec)


def observe_job(body: Mapping[str, Any]) -> JobView:
    """The job as the decisions see it; raises `JobValidationError` naming the fields that are invalid.

    The status is left out of validation: it is the operator's own record and an odd value in it
    must not make the job unmanageable.
    """
    metadata = _mapping(body.get("metadata"))
    model = api.parse_job({k: v for k, v in body.items() if k != "status"})
    spec = model.spec
    policy = spec.failure_policy
    uid = _str(metadata.get("uid"))
    generation = metadata.get("generation")
    return JobView(
        name=model.name,
        namespace=model.namespace,
        uid=uid,
        generation=generation if isinstance(generation, int) else 0,
        nodes=spec.nodes,
        hot_spares=spec.hot_spares,
        suspend=bool(spec.suspend),
        ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
        retention_delete=spec.checkpoint.retention_policy == api.RetentionPolicy.DELETE
        and spec.checkpoint.storage.existing_claim is None,
        policy=FailurePolicy(
            node_loss_grace_seconds=policy.node_loss_grace_seconds,
            max_node_replacements=policy.max_node_replacements,
            backoff_seconds=policy.backoff_seconds,
            repeat_offender_threshold=policy.repeat_offender_threshold,
            taint_excluded_nodes=bool(policy.taint_excluded_nodes),
        ),
        status=dict(_mapping(body.get("status"))),
        model=model,
    )
