"""What a decision asks for: the actions on the API, the Events to post, and the plan that holds them.

`rtj_operator.decide.reconcile` returns a `Plan`; `rtj_operator.runtime.job_pass` writes `Plan.status`
first and then hands each action to `rtj_operator.runtime.kube`, which carries it out idempotently.
Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rtj_operator.api import ResilientTrainingJobStatus
from rtj_operator.progress import RestartOffset

# A pod removed on a healthy node is given this long to exit (seconds); a pod on a dead node is
# force-deleted (grace 0) because no kubelet will ever confirm its termination.
GRACEFUL_DELETE_SECONDS: int | None = None  # None: the pod's own terminationGracePeriodSeconds
FORCE = 0


@dataclass(frozen=True)
class CreateObject:
    """Create a child; AlreadyExists counts as success (the name is deterministic).

    `optional`: the job does without it (a surge pod, `decide.surges`): the API server's refusal
    neither stops the pass's other actions nor blocks the job (`decide.surge_refused`)."""

    manifest: dict[str, Any]
    optional: bool = False

    @property
    def kind(self) -> str:
        return str(self.manifest.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.manifest.get("metadata", {}).get("name", ""))


@dataclass(frozen=True)
class DeletePod:
    """Delete one pod, only if it still has this uid; NotFound counts as success."""

    name: str
    uid: str
    grace_seconds: int | None


@dataclass(frozen=True)
class DeleteObject:
    """Delete a namespaced (or, with namespace None, cluster-scoped) object; NotFound is success."""

    api_version: str
    kind: str
    name: str
    namespace: str | None


@dataclass(frozen=True)
class TaintNode:
    """Add (or remove) a taint on a node, leaving its other taints alone."""

    node: str
    key: str
    value: str
    effect: str
    remove: bool = False


@dataclass(frozen=True)
class DeleteJob:
    """Delete the job itself (ttlSecondsAfterFinished); its finalizer then runs."""

    name: str
    namespace: str
    uid: str


Action = CreateObject | DeletePod | DeleteObject | TaintNode | DeleteJob


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event on the job: type (`events.NORMAL`/`WARNING`), reason, message."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """The outcome of one decision: the status to write, then the actions and Events, in order."""

    status: ResilientTrainingJobStatus
    status_changed: bool
    actions: tuple[Action, ...]
    events: tuple[Event, ...]
    requeue_after: float | None
    offsets: dict[str, RestartOffset] = field(default_factory=dict)
    # Counts for metrics: node_losses, pod_replacements, gang_restarts, surges_created, surges_used.
    counters: dict[str, int] = field(default_factory=dict)
