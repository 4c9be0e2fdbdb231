"""Planned disruptions: the one list of the signals that say a node or pod is being taken away on
purpose (a drain, a node group upgrade, Karpenter consolidation, a spot interruption), apart from
faults.

A planned disruption is not a fault: it is never recorded in `status.nodeFaults`, never charges
`failurePolicy.maxNodeReplacements` (unless `countDisruptions`), never excludes a node, and never
makes the operator force-delete a pod (the node's kubelet is alive and ends the pod itself, after
the checkpoint at SIGTERM). It is counted in `status.budget.disruptions`.

- Node signals (`NODE_SIGNALS`): a cordon and the maintenance tools' taints. Running workers stay
  where they are (the eviction that follows, if any, is a pod signal); no new worker is placed there
  and a hot spare there is not taken. `decide.node_problems.node_disruption` reads them off a node. A spot
  interruption notice is the exception (`moves_workers`): the node goes in two minutes whatever
  happens, so `decide.moves` moves its workers at once, while their checkpoint can still be written.
- Pod signals (`POD_SIGNALS`): the `DisruptionTarget` condition's reasons and the pod status reasons
  that say the pod was pushed off its node. Each is a `Disruption` (`decide.failures`); the few that
  blame the node (`blames_node`) are recorded as the node's fault unless the node shows a node signal
  (then the eviction is the maintenance's).

docs/operations.md ("Planned disruptions") holds `markdown_table()` (print it with
`python -m rtj_operator.disruptions`); a test holds the page to this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The name a cordon (spec.unschedulable) goes by in Events and status messages.
CORDONED = "Cordoned"

SignalKind = Literal["cordon", "taint", "DisruptionTarget", "status.reason"]


@dataclass(frozen=True)
class Signal:
    """One planned disruption signal: what it is called on the object, who sets it, what it does."""

    name: str  # the taint key, the DisruptionTarget reason, the status reason, or CORDONED
    kind: SignalKind
    set_by: str
    effect: str
    # The node goes within minutes whatever the job does: its workers are moved at once (checkpoint at
    # SIGTERM, then a replacement elsewhere) rather than waiting for the drain or the node's end.
    moves_workers: bool = False


_NODE_EFFECT = "nothing moves; no new worker is placed there, a hot spare there is not used; no fault"
_EVICTED = "the worker is replaced once its kubelet has ended it; a disruption, not a fault"

NODE_SIGNALS: tuple[Signal, ...] = (
    Signal(CORDONED, "cordon", "`kubectl cordon`/`drain`, EKS managed node group upgrades", _NODE_EFFECT),
    Signal(
        "karpenter.sh/disrupted", "taint", "Karpenter v1 (NoSchedule) before it drains a node", _NODE_EFFECT
    ),
    Signal(
        "karpenter.sh/disruption",
        "taint",
        "Karpenter v0.32-v0.37 (`disrupting`, NoSchedule) before it drains a node",
        _NODE_EFFECT,
    ),
    Signal(
        "aws-node-termination-handler/spot-itn",
        "taint",
        "AWS Node Termination Handler: a spot interruption notice (2 minutes ahead)",
        "its workers are moved at once (Event `WorkerMoved`): the checkpoint at SIGTERM, then a "
        "replacement elsewhere; a disruption, no fault",
        moves_workers=True,
    ),
    Signal(
        "aws-node-termination-handler/rebalance-recommendation",
        "taint",
        "AWS Node Termination Handler: an EC2 rebalance recommendation",
        _NODE_EFFECT,
    ),
    Signal(
        "aws-node-termination-handler/asg-lifecycle-termination",
        "taint",
        "AWS Node Termination Handler: an ASG scale-in / lifecycle termination",
        _NODE_EFFECT,
    ),
    Signal(
        "aws-node-termination-handler/scheduled-maintenance",
        "taint",
        "AWS Node Termination Handler: an EC2 scheduled maintenance event",
        _NODE_EFFECT,
    ),
    Signal(
        "ToBeDeletedByClusterAutoscaler",
        "taint",
        "the cluster autoscaler (NoSchedule) before it drains a node it scales down",
        _NODE_EFFECT,
    ),
)

POD_SIGNALS: tuple[Signal, ...] = (
    Signal(
        "EvictionByEvictionAPI",
        "DisruptionTarget",
        "the Eviction API: `kubectl drain`, Karpenter, the termination handler, the autoscaler",
        _EVICTED,
    ),
    Signal(
        "PreemptionByScheduler", "DisruptionTarget", "the scheduler, for a pod of higher priority", _EVICTED
    ),
    Signal(
        "TerminationByKubelet",
        "DisruptionTarget",
        "the kubelet: a graceful node shutdown, a critical pod's preemption, node-pressure eviction",
        _EVICTED + "; under node pressure (status reason `Evicted`) the node is recorded in `nodeFaults`",
    ),
    Signal(
        "DeletionByTaintManager",
        "DisruptionTarget",
        "the taint manager, for a NoExecute taint the pod does not tolerate",
        _EVICTED + "; the node is recorded in `nodeFaults` unless it shows a node signal above",
    ),
    Signal(
        "DeletionByPodGC",
        "DisruptionTarget",
        "PodGC, for a pod of a deleted or out-of-service node",
        "the node's loss is judged from the node (a deleted node is a fault)",
    ),
    Signal("Evicted", "status.reason", "the kubelet or an eviction", _EVICTED),
    Signal("Preempting", "status.reason", "the kubelet, for a critical pod", _EVICTED),
    Signal("Terminated", "status.reason", "the kubelet, on a graceful node shutdown", _EVICTED),
    Signal(
        "Shutdown", "status.reason", "the kubelet, on a graceful node shutdown (older kubelets)", _EVICTED
    ),
)

NODE_TAINTS = frozenset(s.name for s in NODE_SIGNALS if s.kind == "taint")
MOVING_TAINTS = frozenset(s.name for s in NODE_SIGNALS if s.kind == "taint" and s.moves_workers)
DISRUPTION_TARGET_REASONS = frozenset(s.name for s in POD_SIGNALS if s.kind == "DisruptionTarget")
STATUS_REASONS = frozenset(s.name for s in POD_SIGNALS if s.kind == "status.reason")


def is_pod_disruption(disruption_target: str | None, status_reason: str) -> bool:
    """Whether a pod's DisruptionTarget reason (any, when True) or status reason says it was pushed off."""
    return bool(disruption_target) or status_reason in STATUS_REASONS


def blames_node(disruption_target: str | None, status_reason: str, *, node_in_maintenance: bool) -> bool:
    """Whether a pod disruption is its node's fault: the taint manager acting on a NoExecute taint that
    is no maintenance's, or the kubelet evicting under node pressure."""
    if disruption_target == "DeletionByTaintManager":
        return not node_in_maintenance
    return disruption_target == "TerminationByKubelet" and status_reason == "Evicted"


def markdown_table() -> str:
    """The docs' table of every signal: name, kind, who sets it, what the operator does."""
    rows = [
        "| signal | kind | set by | what the operator does |",
        "|---|---|---|---|",
        *(f"| `{s.name}` | {s.kind} | {s.set_by} | {s.effect} |" for s in (*NODE_SIGNALS, *POD_SIGNALS)),
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
