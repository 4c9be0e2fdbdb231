"""What is wrong with a worker's node, judged from the observed nodes (`node_problem`): NotReady or
Unknown beyond the grace period, a NoExecute taint the pod does not tolerate, deleted, or one of the
health signals of the operator's `NodeHealth` settings (`health_problem`: a condition, a taint, a
label, allocatable GPUs/EFA below the worker's request, faults the trainer blames on the node). A
planned disruption (a cordon, a maintenance taint: `rtj_operator.disruptions`) is no problem;
`node_disruption` names it, and `node_departure` the notice of a node about to go.

Pure: no I/O, time passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from rtj_operator import disruptions
from rtj_operator.nodehealth import (
    SIGNAL_INSUFFICIENT_ALLOCATABLE,
    SIGNAL_TRAINER_REPORTED,
    NodeHealth,
    matching_labels,
)
from rtj_operator.observe import NodeState, PodState, Taint, Toleration

# The taints the node lifecycle controller puts on NotReady / Unknown nodes: they mirror the Ready
# condition, so they are judged with the same grace period rather than at once.
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
NODE_HEALTH_TAINTS = frozenset({TAINT_NOT_READY, TAINT_UNREACHABLE})

# The problems that leave no kubelet to end the node's pods: only theirs are force-deleted.
KUBELET_GONE_REASONS = frozenset({"NodeDeleted", "NodeNotReady", "NodeUnreachable"})


@dataclass(frozen=True)
class NodeProblem:
    """Why a node is unfit for a worker; `permanent` when the node is gone for good."""

    # NodeDeleted, NodeNotReady, NodeUnreachable, NodeTainted, or a health signal's name (nodehealth)
    reason: str
    message: str
    permanent: bool = False

    @property
    def kubelet_gone(self) -> bool:
        """Whether no kubelet will end the node's pods (deleted, NotReady or unreachable past the
        grace): only then is a pod there force-deleted. On a node that is merely unfit (a health
        signal, a NoExecute taint) the kubelet ends the pod itself, so two incarnations never run."""
        return self.reason in KUBELET_GONE_REASONS


def node_problem(  # noqa: PLR0913 - the health settings and the pod are keyword-only
    node_name: str,
    nodes: Mapping[str, NodeState],
    tolerations: tuple[Toleration, ...],
    now: datetime,
    grace_seconds: int,
    *,
    health: NodeHealth | None = None,
    pod: PodState | None = None,
) -> tuple[NodeProblem | None, datetime | None]:
    """What is wrong with the node a pod is bound to, and when to look again if nothing is wrong yet.

    Returns (problem, None) for a node that is unfit now, (None, when) for a node that will become
    unfit at `when` unless it recovers (NotReady within the grace period), (None, None) for a healthy
    node. An unbound pod (`node_name` empty) has no node problem. With `health`, a Ready node is also
    judged by its health signals (`health_problem`; `pod` gives the requests and the trainer's report).
    """
    if not node_name:
        return None, None
    node = nodes.get(node_name)
    if node is None:
        return NodeProblem("NodeDeleted", f"node {node_name} was deleted", permanent=True), None
    grace = timedelta(seconds=grace_seconds)
    recheck: datetime | None = None

    if node.ready != "True":
        since = node.ready_since or now
        if now - since >= grace:
            reason = "NodeUnreachable" if node.ready == "Unknown" else "NodeNotReady"
            return NodeProblem(
                reason, f"node {node_name} has been Ready={node.ready} since {since.isoformat()}"
            ), None
        recheck = since + grace

    signals = health or NodeHealth()
    for taint in node.taints:
        # A maintenance taint with NoExecute is a planned disruption: the taint manager's eviction of
        # the pod says so (decide.failures), the node is no problem.
        if taint.effect != "NoExecute" or signals.planned_taint([taint.key]) is not None:
            continue
        problem, when = _taint_problem(node, taint, tolerations, now, grace)
        if problem is not None:
            return problem, None
        if when is not None:
            recheck = min(recheck, when) if recheck else when
    if health is not None:
        found = health_problem(node, health, pod)
        if found is not None:
            return found, None
    return None, recheck


def health_problem(node: NodeState, health: NodeHealth, pod: PodState | None = None) -> NodeProblem | None:
    """The first health signal of `health` the node shows (nodehealth's module docstring), or None.

    Node-wide signals first (conditions, labels, taints), then those that depend on the pod:
    allocatable below its requests, faults its trainer reported on this node.
    """
    found = node_health_problem(node, health)
    if found is None and pod is not None:
        found = _allocatable_problem(node, health, pod) or _reported_problem(node, health, pod)
    return found


def node_health_problem(node: NodeState, health: NodeHealth) -> NodeProblem | None:
    """The first node-wide health signal (a condition, a label, a taint), or None."""
    for kind, unhealthy in sorted(health.conditions.items()):
        condition = node.conditions.get(kind)
        if condition is not None and condition.status == unhealthy:
            detail = ": ".join(part for part in (condition.reason, condition.message) if part)
            message = f"node {node.name} has the condition {kind}={unhealthy}"
            return _signal(health, kind, f"{message} ({detail})" if detail else message)
    for key, value in matching_labels(node.labels, health.labels):
        # A planned disruption's label is never a fault, even if the settings list it as one too.
        if health.planned_label({key: value}) is None:
            name = value if health.labels[key] else key
            return _signal(health, name, f"node {node.name} has the label {key}={value}")
    for taint in node.taints:
        # A planned disruption's taint is never a fault, even if the settings list it.
        if taint.key in health.taints and health.planned_taint([taint.key]) is None:
            text = f"node {node.name} has the taint {taint.key}:{taint.effect}"
            return _signal(health, taint.key, text)
    return None


def node_disruption(node: NodeState, health: NodeHealth) -> str | None:
    """The planned disruption the node shows (`disruptions.NODE_SIGNALS` and the settings' own): a
    maintenance taint's key, a label's `key=value`, `Cordoned`, or None. Not a problem: the node's pods
    stay, new ones go elsewhere."""
    found = health.planned_taint(t.key for t in node.taints) or health.planned_label(node.labels)
    if found is not None:
        return found
    return disruptions.CORDONED if node.unschedulable else None


def node_departure(node: NodeState, health: NodeHealth) -> str | None:
    """The signal that says the node goes within minutes whatever the job does (a spot interruption
    notice: the termination handler's taint, or the settings' notice taints and labels), or None."""
    return health.notice_taint(t.key for t in node.taints) or health.notice_label(node.labels)


def _allocatable_problem(node: NodeState, health: NodeHealth, pod: PodState) -> NodeProblem | None:
    for resource in health.resources:
        wanted = pod.requests.get(resource, 0)
        have = node.allocatable.get(resource, "0").strip()
        if wanted > 0 and have.isdigit() and int(have) < wanted:
            text = f"node {node.name} has {have} {resource} allocatable, the worker requests {wanted}"
            return _signal(health, SIGNAL_INSUFFICIENT_ALLOCATABLE, text)
    return None


def _reported_problem(node: NodeState, health: NodeHealth, pod: PodState) -> NodeProblem | None:
    faults = pod.report.node_faults if pod.report is not None else None
    threshold = health.trainer_fault_threshold
    if faults is None or threshold <= 0 or faults.node != node.name or faults.count < threshold:
        return None
    last = f"; last: {faults.last_reason}" if faults.last_reason else ""
    text = (
        f"the trainer on node {node.name} reported {faults.count} faults it attributes to the node "
        f"(threshold {threshold}){last}"
    )
    return _signal(health, SIGNAL_TRAINER_REPORTED, text)


def _signal(health: NodeHealth, signal: str, message: str) -> NodeProblem:
    return NodeProblem(signal, message, permanent=health.is_permanent(signal))


def _taint_problem(
    node: NodeState, taint: Taint, tolerations: tuple[Toleration, ...], now: datetime, grace: timedelta
) -> tuple[NodeProblem | None, datetime | None]:
    """What a NoExecute taint means for a pod: a problem now, or when to look again (as node_problem)."""
    if taint.key in NODE_HEALTH_TAINTS:
        since = taint.time_added or node.ready_since or now
        if now - since >= grace:
            reason = "NodeUnreachable" if taint.key == TAINT_UNREACHABLE else "NodeNotReady"
            return NodeProblem(reason, f"node {node.name} has the taint {taint.key}:NoExecute"), None
        return None, since + grace
    tolerating = [t for t in tolerations if t.matches(taint)]
    if not tolerating:
        return NodeProblem("NodeTainted", f"node {node.name} has the taint {taint.key}:NoExecute"), None
    bounded = [t.seconds for t in tolerating if t.seconds is not None]
    if bounded and len(bounded) == len(tolerating):
        until = (taint.time_added or now) + timedelta(seconds=max(bounded))
        if now >= until:
            return NodeProblem(
                "NodeTainted", f"node {node.name} has had the taint {taint.key}:NoExecute too long"
            ), None
        return None, until
    return None, None


# --- the job ----------------------------------------------------------------------------------------------
