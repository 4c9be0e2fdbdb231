"""The operator's decisions: `reconcile(job, observed, now) -> Plan`, a pure function.

`handlers` (kopf wiring) builds a `JobView` and an `Observed` (see `observe`), calls `reconcile`, then
writes `Plan.status` first and applies `Plan.actions` after (through `kube`). Nothing here does I/O.

Writing status before acting is what makes the counters exact across operator crashes. Each worker
and spare has an entry in `status.workers.pods` whose `state` is the operator's record of it:

- `Creating`: a pod is wanted and none of the job's has been seen on a node yet; `nodeName`, if set,
  is the node the pod is pinned to (a hot spare's node).
- `Pending` / `Running` / `Succeeded` / `Failed`: the pod was seen in that phase on `nodeName`.
- `Replacing`: a fault was counted; the old pod is to be removed and a new one created.
- `Suspended`: the job is suspended; no pod is wanted.

A fault is counted only when an entry in `Pending`/`Running` on a node meets a lost, failed or
disrupted pod, and the same status write moves the entry to `Replacing`. A crash after that write
but before the deletes/creates resumes from `Replacing` without counting again; a crash before it
recounts nothing because nothing was written. Pod names are deterministic and creates treat
AlreadyExists as success, so a retried plan never duplicates a pod.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rtj_operator import constants, events
from rtj_operator.observe import JobView, NodeProblem, Observed, PodState, node_problem
from rtj_operator.progress import RestartOffset, fold_progress, format_time, parse_time

# Entry states (status.workers.pods[].state).
CREATING = "Creating"
PENDING = "Pending"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
REPLACING = "Replacing"
SUSPENDED_STATE = "Suspended"
OBSERVED_ON_NODE = frozenset({PENDING, RUNNING})

# A pod removed on a healthy node is given this long to exit (seconds); a pod on a dead node is
# force-deleted (grace 0) because no kubelet will ever confirm its termination.
GRACEFUL_DELETE_SECONDS: int | None = None  # None: the pod's own terminationGracePeriodSeconds
FORCE = 0


# --- actions ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateObject:
    """Create a child; AlreadyExists counts as success (the name is deterministic)."""

    manifest: dict[str, Any]

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
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    status: dict[str, Any]
    status_changed: bool
    actions: tuple[Action, ...]
    events: tuple[Event, ...]
    requeue_after: float | None
    offsets: dict[str, RestartOffset] = field(default_factory=dict)
    # Counts for metrics: node_losses, pod_replacements, gang_restarts.
    counters: dict[str, int] = field(default_factory=dict)


# --- conditions -------------------------------------------------------------------------------------------


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    *,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> bool:
    """Set a condition in place; lastTransitionTime moves only when `status` flips. Returns flipped."""
    value = "True" if status else "False"
    for condition in conditions:
        if condition.get("type") == type_:
            flipped = condition.get("status") != value
            condition.update(status=value, reason=reason, message=message, observedGeneration=generation)
            if flipped or not condition.get("lastTransitionTime"):
                condition["lastTransitionTime"] = format_time(now)
            return flipped
    conditions.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_time(now),
            "observedGeneration": generation,
        }
    )
    return True


def condition_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def state_from_conditions(conditions: Sequence[Mapping[str, Any]]) -> str:
    """status.state, for kubectl: the most significant true condition."""
    for type_, state in (
        (events.COND_FAILED, events.STATE_FAILED),
        (events.COND_SUCCEEDED, events.STATE_SUCCEEDED),
        (events.COND_SUSPENDED, events.STATE_SUSPENDED),
        (events.COND_RECOVERING, events.STATE_RECOVERING),
        (events.COND_READY, events.STATE_RUNNING),
    ):
        if condition_true(conditions, type_):
            return state
    return events.STATE_PENDING


def _sorted_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {t: i for i, t in enumerate(events.CONDITION_TYPES)}
    return sorted(conditions, key=lambda c: order.get(str(c.get("type")), len(order)))


# --- the pass ---------------------------------------------------------------------------------------------


@dataclass
class _Loss:
    index: int
    pod: PodState | None
    reason: str  # an event reason: NodeLost, WorkerDisrupted, WorkerFailed
    message: str
    node_problem: NodeProblem | None  # set when the node is to blame


class _Pass:
    """One reconcile pass: a mutable working copy of status plus the actions and events decided."""

    def __init__(self, job: JobView, observed: Observed, now: datetime) -> None:
        self.job, self.observed, self.now = job, observed, now
        old = copy.deepcopy(dict(job.status))
        self.old_status = job.status
        self.conditions: list[dict[str, Any]] = [
            c for c in old.get("conditions") or [] if isinstance(c, dict)
        ]
        self.restarts: dict[str, Any] = dict(old.get("restarts") or {})
        for key in ("inProcess", "inJob", "podReplacement"):
            value = self.restarts.get(key)
            self.restarts[key] = value if isinstance(value, int) and value >= 0 else 0
        self.excluded: list[dict[str, Any]] = [
            e for e in old.get("excludedNodes") or [] if isinstance(e, dict)
        ]
        self.faults: list[dict[str, Any]] = [f for f in old.get("nodeFaults") or [] if isinstance(f, dict)]
        self.start_time: str | None = old.get("startTime")
        self.completion_time: str | None = old.get("completionTime")
        self.progress = old.get("progress")
        self.last_checkpoint = old.get("lastCheckpoint")
        self.entries: dict[tuple[str, int], dict[str, Any]] = {}
        workers = old.get("workers") or {}
        for entry in workers.get("pods") or []:
            if isinstance(entry, dict) and isinstance(entry.get("index"), int):
                self.entries[(str(entry.get("role")), entry["index"])] = {
                    "index": entry["index"],
                    "role": str(entry.get("role")),
                    "podName": str(entry.get("podName") or ""),
                    "nodeName": str(entry.get("nodeName") or ""),
                    "state": str(entry.get("state") or CREATING),
                }
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: datetime | None = None
        self.counters: dict[str, int] = {"node_losses": 0, "pod_replacements": 0, "gang_restarts": 0}
        self.created_pods = False
        self.faulted_nodes_this_pass: set[str] = set()
        self.spares_taken: set[int] = set()
        self.pods: dict[tuple[str, int], PodState] = {}
        self.stray: list[PodState] = []
        for pod in observed.pods:
            expected = (
                job.worker_name(pod.index) if pod.role == constants.ROLE_WORKER else job.spare_name(pod.index)
            )
            limit = job.nodes if pod.role == constants.ROLE_WORKER else job.hot_spares
            if pod.name != expected:
                continue  # not a name this job creates: someone else's pod carrying our labels
            if pod.index >= limit:
                self.stray.append(pod)
            else:
                self.pods[(pod.role, pod.index)] = pod

    # -- small helpers --

    def at(self, moment: datetime) -> None:
        """Ask to be reconciled again at `moment` (the earliest one wins)."""
        if self.requeue is None or moment < self.requeue:
            self.requeue = moment

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def problem(self, pod: PodState) -> NodeProblem | None:
        found, recheck = node_problem(
            pod.node_name,
            self.observed.nodes,
            pod.tolerations,
            self.now,
            self.job.policy.node_loss_grace_seconds,
        )
        if recheck is not None:
            self.at(recheck)
        return found

    def excluded_names(self) -> list[str]:
        names = {str(e.get("nodeName")) for e in self.excluded if e.get("nodeName")}
        # Nodes that are not Ready right now are avoided too: a replacement must not land on the node
        # that was just lost while it flaps.
        names |= {n.name for n in self.observed.nodes.values() if n.ready != "True"}
        return sorted(names)

    def entry(self, role: str, index: int) -> dict[str, Any]:
        key = (role, index)
        if key not in self.entries:
            name = (
                self.job.worker_name(index) if role == constants.ROLE_WORKER else self.job.spare_name(index)
            )
            self.entries[key] = {
                "index": index,
                "role": role,
                "podName": name,
                "nodeName": "",
                "state": CREATING,
            }
        return self.entries[key]

    def delete_pod(self, pod: PodState, *, force: bool) -> None:
        if pod.deleting and not force:
            return
        if pod.deleting and pod.deletion_grace_seconds == 0:
            return
        if force and pod.deleting:
            self.event(
                events.WARNING,
                events.STRANDED_POD_DELETED,
                f"pod {pod.name} was stuck terminating on unreachable node {pod.node_name}; force-deleted",
            )
        self.actions.append(DeletePod(pod.name, pod.uid, FORCE if force else GRACEFUL_DELETE_SECONDS))

    def record_node_fault(self, node: str, problem: NodeProblem) -> None:
        if not node or node in self.faulted_nodes_this_pass:
            return
        self.faulted_nodes_this_pass.add(node)
        record = next((f for f in self.faults if f.get("nodeName") == node), None)
        if record is None:
            record = {"nodeName": node, "count": 0}
            self.faults.append(record)
        record["count"] = int(record.get("count") or 0) + 1
        record["lastReason"] = problem.reason
        record["lastTime"] = format_time(self.now)
        threshold = self.job.policy.repeat_offender_threshold
        if any(e.get("nodeName") == node for e in self.excluded):
            return
        if problem.permanent or record["count"] >= threshold:
            why = problem.reason if problem.permanent else "RepeatOffender"
            self.excluded.append({"nodeName": node, "reason": why, "time": format_time(self.now)})
            detail = (
                "it was deleted" if problem.permanent else f"{record['count']} faults (threshold {threshold})"
            )
            self.event(events.WARNING, events.NODE_EXCLUDED, f"node {node} excluded for this job: {detail}")
            if self.job.policy.taint_excluded_nodes and node in self.observed.nodes:
                self.actions.append(TaintNode(node, constants.TAINT_EXCLUDED, self.job.name, "NoSchedule"))
                self.event(
                    events.NORMAL,
                    events.NODE_TAINTED,
                    f"node {node} tainted {constants.TAINT_EXCLUDED}={self.job.name}:NoSchedule",
                )

    def condition(self, type_: str, status: bool, reason: str, message: str) -> bool:
        return set_condition(
            self.conditions,
            type_,
            status=status,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.job.generation,
        )

    # -- the phases of a pass --

    def sync_entry_from_pod(self, entry: dict[str, Any], pod: PodState | None) -> None:
        """Record what is observed of a pod that is not being replaced."""
        if pod is None or pod.deleting:
            return
        if pod.phase == "Succeeded":
            entry.update(state=SUCCEEDED, nodeName=pod.node_name or entry["nodeName"])
        elif pod.node_name:
            entry.update(state=RUNNING if pod.phase == "Running" else PENDING, nodeName=pod.node_name)
        elif entry["state"] != CREATING:
            entry.update(state=PENDING)

    def detect_loss(self, index: int) -> _Loss | None:
        entry = self.entry(constants.ROLE_WORKER, index)
        pod = self.pods.get((constants.ROLE_WORKER, index))
        recorded = entry["state"] in OBSERVED_ON_NODE and bool(entry["nodeName"])
        if pod is None:
            if recorded:
                node_state = self.observed.nodes.get(entry["nodeName"])
                if node_state is None:
                    gone = NodeProblem("NodeDeleted", f"node {entry['nodeName']} was deleted", permanent=True)
                    return _Loss(index, None, events.NODE_LOST, gone.message, gone)
                return _Loss(
                    index, None, events.WORKER_DISRUPTED, f"worker pod {entry['podName']} was deleted", None
                )
            return None
        # Only a pod recorded on its node can be lost: a pod still `Creating` in status is recorded by
        # this pass (run_worker) and its faults count from the next pass on.
        if not recorded or pod.node_name != entry["nodeName"]:
            return None
        if pod.phase == "Succeeded":
            return None
        problem = self.problem(pod)
        if problem is not None:
            return _Loss(index, pod, events.NODE_LOST, problem.message, problem)
        if pod.disruption or pod.status_reason in {"Evicted", "Preempting", "Terminated", "Shutdown"}:
            cause = pod.disruption or pod.status_reason
            node_blamed = NodeProblem(cause, f"pod {pod.name} disrupted on {pod.node_name}: {cause}")
            return _Loss(
                index,
                pod,
                events.WORKER_DISRUPTED,
                f"worker pod {pod.name} was disrupted ({cause})",
                node_blamed if cause in {"DeletionByTaintManager", "TerminationByKubelet"} else None,
            )
        if pod.deleting:
            return _Loss(index, pod, events.WORKER_DISRUPTED, f"worker pod {pod.name} was deleted", None)
        if pod.phase == "Failed":
            detail = f": {pod.message}" if pod.message else ""
            return _Loss(index, pod, events.WORKER_FAILED, f"worker pod {pod.name} failed{detail}", None)
        return None

    def handle_losses(self, losses: list[_Loss]) -> bool:
        """Count the losses, exclude nodes, pick the restart scope. False when the budget is exhausted."""
        process_failures = [loss for loss in losses if loss.reason == events.WORKER_FAILED]
        node_or_disruption = [loss for loss in losses if loss.reason != events.WORKER_FAILED]
        # Worker 0 hosts the c10d rendezvous store: without it the survivors cannot re-rendezvous. A
        # pod that exited non-zero on a healthy node means its ft_launcher gave up: the processes, not
        # the node, failed, and only a fresh start of every pod brings the job back.
        gang = bool(process_failures) or any(loss.index == 0 for loss in losses)
        count = len(node_or_disruption) if node_or_disruption else 1
        for loss in losses:
            self.event(events.WARNING, loss.reason, loss.message)
            if loss.node_problem is not None:
                node = (
                    loss.pod.node_name
                    if loss.pod
                    else self.entry(constants.ROLE_WORKER, loss.index)["nodeName"]
                )
                self.record_node_fault(node, loss.node_problem)
                if loss.reason == events.NODE_LOST:
                    self.counters["node_losses"] += 1
        budget = self.job.policy.max_node_replacements
        if self.restarts["podReplacement"] + count > budget:
            self.fail_budget(losses)
            return False
        self.restarts["podReplacement"] += count
        self.counters["pod_replacements"] += count
        lead = losses[0]
        self.condition(events.COND_RECOVERING, True, lead.reason, lead.message)
        if gang:
            self.counters["gang_restarts"] += 1
            why = (
                "worker 0 (the rendezvous host) was lost"
                if any(loss.index == 0 for loss in node_or_disruption)
                else "a worker's processes failed"
            )
            self.event(events.WARNING, events.GANG_RESTART, f"restarting all {self.job.nodes} workers: {why}")
            for index in range(self.job.nodes):
                self.entry(constants.ROLE_WORKER, index).update(state=REPLACING)
        else:
            for loss in losses:
                self.entry(constants.ROLE_WORKER, loss.index).update(state=REPLACING)
        return True

    def fail_budget(self, losses: list[_Loss]) -> None:
        budget = self.job.policy.max_node_replacements
        message = (
            f"{self.restarts['podReplacement']} of {budget} pod replacements used; "
            f"not replacing after: {losses[0].message}"
        )
        self.condition(events.COND_FAILED, True, events.RESTART_BUDGET_EXHAUSTED, message)
        self.event(events.WARNING, events.RESTART_BUDGET_EXHAUSTED, message)
        self.completion_time = self.completion_time or format_time(self.now)
        self.remove_all_pods()

    def remove_all_pods(
        self, *, roles: Sequence[str] = (constants.ROLE_WORKER, constants.ROLE_SPARE)
    ) -> None:
        for (role, _), pod in sorted(self.pods.items()):
            if role in roles and pod.phase not in {"Succeeded"}:
                self.delete_pod(pod, force=self.problem(pod) is not None)
        for pod in self.stray:
            self.delete_pod(pod, force=self.problem(pod) is not None)

    def backoff_until(self) -> datetime | None:
        """Replacements are spaced by backoffSeconds from the newest pod created after a fault."""
        backoff = self.job.policy.backoff_seconds
        newest = max(
            (
                p.created
                for p in self.pods.values()
                if p.role == constants.ROLE_WORKER
                and p.restart_count_annotation is not None
                # pods created for the restart in progress (a gang) do not hold back their siblings
                and p.restart_count_annotation < self.restarts["podReplacement"]
                and p.created
            ),
            default=None,
        )
        if newest is None or backoff <= 0:
            return None
        until = newest + timedelta(seconds=backoff)
        return until if until > self.now else None

    def take_spare(self, excluded: Sequence[str]) -> str | None:
        """Give up a ready spare for a replacement; returns its node."""
        for k in range(self.job.hot_spares):
            pod = self.pods.get((constants.ROLE_SPARE, k))
            if pod is None or pod.deleting or not pod.ready or pod.phase != "Running" or not pod.node_name:
                continue
            if pod.node_name in excluded or self.problem(pod) is not None:
                continue
            # Graceful: the replacement is pinned to the node by required affinity, so the scheduler
            # waits until the spare has released the node's GPUs rather than racing kubelet admission.
            self.delete_pod(pod, force=False)
            self.entry(constants.ROLE_SPARE, k).update(state=CREATING, nodeName="")
            del self.pods[(constants.ROLE_SPARE, k)]
            # Its successor is created on a later pass, once the name is free again.
            self.spares_taken.add(k)
            return pod.node_name
        return None

    def release_spare_on(self, node: str) -> None:
        """Make sure no spare still holds `node`, which a replacement worker is pinned to.

        Normally the spare was deleted in the pass that pinned the worker; this covers an operator that
        stopped between writing that decision and deleting the spare.
        """
        for k in range(self.job.hot_spares):
            pod = self.pods.get((constants.ROLE_SPARE, k))
            if pod is not None and pod.node_name == node:
                self.delete_pod(pod, force=False)
                self.entry(constants.ROLE_SPARE, k).update(state=CREATING, nodeName="")
                del self.pods[(constants.ROLE_SPARE, k)]
                self.spares_taken.add(k)

    def pinned_nodes(self, *, except_index: int | None = None) -> set[str]:
        """Nodes that replacement workers still being created are pinned to."""
        return {
            e["nodeName"]
            for e in self.entries.values()
            if e["role"] == constants.ROLE_WORKER
            and e["state"] == CREATING
            and e["nodeName"]
            and e["index"] != except_index
        }

    def stale_pin(self, index: int, node: str) -> bool:
        """A pin that can no longer be honoured: the node is gone, excluded, unfit or taken."""
        if node not in self.observed.nodes or node in self.excluded_names():
            return True
        for (role, other), pod in self.pods.items():
            if (
                pod.node_name == node
                and not pod.deleting
                and not (role == constants.ROLE_WORKER and other == index)
            ):
                return True
        return False

    def create_worker(
        self, index: int, node_name: str | None, *, replacement: bool, replaced_node: str
    ) -> None:
        excluded = self.excluded_names()
        if not node_name:
            # Keep unpinned workers off the nodes that replacements are pinned to (spares' nodes).
            excluded = sorted(set(excluded) | self.pinned_nodes(except_index=index))
        manifest = copy.deepcopy(self.job.renderer.worker(index, excluded, node_name or None))
        if replacement:
            annotations = manifest.setdefault("metadata", {}).setdefault("annotations", {})
            annotations[constants.ANNOTATION_RESTART_COUNT] = str(self.restarts["podReplacement"])
            if replaced_node:
                annotations[constants.ANNOTATION_REPLACES] = replaced_node
        self.actions.append(CreateObject(manifest))
        self.created_pods = True

    def run_worker(self, index: int) -> None:
        """Drive one worker's entry toward a running pod."""
        entry = self.entry(constants.ROLE_WORKER, index)
        pod = self.pods.get((constants.ROLE_WORKER, index))
        if entry["state"] == REPLACING:
            until = self.backoff_until()
            if pod is not None:
                # The old pod is kept (even stranded on a dead node) until the backoff has passed: its
                # creation time is what the backoff is measured from.
                if until is not None:
                    self.at(until)
                else:
                    self.delete_pod(pod, force=self.problem(pod) is not None)
                return
            if until is not None:
                self.at(until)
                return
            excluded = self.excluded_names()
            replaced_node = entry["nodeName"]
            spare_node = self.take_spare(excluded) if self.job.hot_spares else None
            entry.update(state=CREATING, nodeName=spare_node or "")
            if spare_node:
                self.event(
                    events.NORMAL,
                    events.SPARE_USED,
                    f"worker {index} replaced on hot spare node {spare_node}",
                )
            where = f"on node {spare_node}" if spare_node else "by the scheduler"
            self.event(
                events.NORMAL, events.WORKER_REPLACED, f"worker {index} replacement created, placed {where}"
            )
            self.create_worker(index, spare_node, replacement=True, replaced_node=replaced_node)
            return
        if entry["state"] == CREATING:
            if pod is None:
                pinned = entry["nodeName"]
                if pinned and (pinned not in self.observed.nodes or pinned in self.excluded_names()):
                    pinned = ""
                    entry["nodeName"] = ""
                if pinned:
                    self.release_spare_on(pinned)
                replacement = self.restarts["podReplacement"] > 0 and self.start_time is not None
                self.create_worker(index, pinned or None, replacement=replacement, replaced_node="")
                return
            if self.problem(pod) is not None:
                # Not yet counted (never seen running): remove it and create it again elsewhere.
                self.delete_pod(pod, force=True)
                return
            if (
                not pod.node_name
                and entry["nodeName"]
                and not pod.deleting
                and self.stale_pin(index, entry["nodeName"])
            ):
                # Pinned to a spare's node that another pod took meanwhile: the scheduler would
                # wait forever. Not yet started, so it is simply created again, unpinned.
                entry["nodeName"] = ""
                self.delete_pod(pod, force=True)
                return
        self.sync_entry_from_pod(entry, pod)

    def record_spare_faults(self) -> None:
        """Count faults of the spares' nodes before any pod is created, so every pod created in this
        pass is kept off a node excluded in it."""
        for k in range(self.job.hot_spares):
            pod = self.pods.get((constants.ROLE_SPARE, k))
            entry = self.entry(constants.ROLE_SPARE, k)
            if pod is None or entry["state"] not in OBSERVED_ON_NODE or entry["nodeName"] != pod.node_name:
                continue
            problem = self.problem(pod)
            if problem is not None:
                self.record_node_fault(pod.node_name, problem)

    def run_spare(self, index: int) -> None:
        entry = self.entry(constants.ROLE_SPARE, index)
        pod = self.pods.get((constants.ROLE_SPARE, index))
        if index in self.spares_taken:
            return
        if pod is None:
            entry.update(state=CREATING, nodeName="")
            # Keep new spares off the nodes that replacement workers are pinned to (a spare's old node).
            pinned = {
                e["nodeName"]
                for e in self.entries.values()
                if e["role"] == constants.ROLE_WORKER and e["state"] == CREATING and e["nodeName"]
            }
            excluded = sorted(set(self.excluded_names()) | pinned)
            self.actions.append(CreateObject(copy.deepcopy(self.job.renderer.spare(index, excluded))))
            self.created_pods = True
            return
        problem = self.problem(pod)
        if problem is not None:
            if entry["state"] in OBSERVED_ON_NODE and entry["nodeName"] == pod.node_name:
                self.record_node_fault(pod.node_name, problem)
                self.event(events.WARNING, events.NODE_LOST, f"spare pod {pod.name}: {problem.message}")
            entry.update(state=CREATING, nodeName="")
            self.delete_pod(pod, force=True)
            return
        if pod.phase in {"Failed", "Succeeded"} or pod.disruption:
            entry.update(state=CREATING, nodeName="")
            self.delete_pod(pod, force=False)
            return
        self.sync_entry_from_pod(entry, pod)

    def worker_counts(self) -> tuple[int, int, int]:
        ready = sum(
            1
            for i in range(self.job.nodes)
            if (p := self.pods.get((constants.ROLE_WORKER, i))) is not None
            and p.ready
            and p.phase == "Running"
            and not p.deleting
            and self.entry(constants.ROLE_WORKER, i)["state"] == RUNNING
        )
        succeeded = sum(
            1 for i in range(self.job.nodes) if self.entry(constants.ROLE_WORKER, i)["state"] == SUCCEEDED
        )
        spares = sum(
            1
            for k in range(self.job.hot_spares)
            if (p := self.pods.get((constants.ROLE_SPARE, k))) is not None and p.ready and not p.deleting
        )
        return ready, succeeded, spares

    def fold(self) -> dict[str, RestartOffset]:
        reports = [
            (p.uid, p.report)
            for (role, _), p in sorted(self.pods.items())
            if role == constants.ROLE_WORKER and p.report is not None
        ]
        folded = fold_progress(
            {
                "restarts": self.restarts,
                "progress": self.progress,
                "lastCheckpoint": self.last_checkpoint,
            },
            reports,
            self.observed.offsets,
        )
        self.restarts["inProcess"] = folded.in_process_restarts
        self.restarts["inJob"] = folded.in_job_restarts
        self.progress = folded.progress
        self.last_checkpoint = folded.last_checkpoint
        return folded.offsets

    def status(self, ready: int, spares: int) -> dict[str, Any]:
        self.restarts["total"] = (
            self.restarts["inProcess"] + self.restarts["inJob"] + self.restarts["podReplacement"]
        )
        pods = [
            self.entries[k] for k in sorted(self.entries, key=lambda k: (k[0] != constants.ROLE_WORKER, k[1]))
        ]
        status: dict[str, Any] = {
            "observedGeneration": self.job.generation,
            "state": state_from_conditions(self.conditions),
            "conditions": _sorted_conditions(self.conditions),
            "workers": {
                "desired": self.job.nodes,
                "ready": ready,
                "readySpares": spares,
                "readyText": f"{ready}/{self.job.nodes}",
                "pods": pods,
            },
            "restarts": {k: self.restarts[k] for k in ("inProcess", "inJob", "podReplacement", "total")},
            "excludedNodes": self.excluded,
            "nodeFaults": self.faults,
        }
        for key, value in (
            ("startTime", self.start_time),
            ("completionTime", self.completion_time),
            ("progress", self.progress),
            ("lastCheckpoint", self.last_checkpoint),
        ):
            if value:
                status[key] = value
        return status


def _finished(conditions: Sequence[Mapping[str, Any]]) -> bool:
    return condition_true(conditions, events.COND_SUCCEEDED) or condition_true(conditions, events.COND_FAILED)


def reconcile(job: JobView, observed: Observed, now: datetime) -> Plan:
    """Decide, from the job and what is observed of it at `now`, the next status and actions."""
    run = _Pass(job, observed, now)
    nodes = job.nodes

    if _finished(run.conditions):
        _reconcile_finished(run)
    elif job.suspend:
        _reconcile_suspended(run)
    else:
        if condition_true(run.conditions, events.COND_SUSPENDED):
            run.condition(events.COND_SUSPENDED, False, events.RESUMED, "spec.suspend is false")
            run.event(events.NORMAL, events.RESUMED, "job resumed: recreating workers")
            for entry in run.entries.values():
                if entry["state"] == SUSPENDED_STATE:
                    entry.update(state=CREATING, nodeName="")
        elif not any(c.get("type") == events.COND_SUSPENDED for c in run.conditions):
            run.condition(events.COND_SUSPENDED, False, events.REASON_NOT_SUSPENDED, "spec.suspend is false")
        for pod in run.stray:
            run.delete_pod(pod, force=run.problem(pod) is not None)
        for key in [
            k for k in run.entries if k[1] >= (nodes if k[0] == constants.ROLE_WORKER else job.hot_spares)
        ]:
            del run.entries[key]

        losses = [loss for loss in (run.detect_loss(i) for i in range(nodes)) if loss is not None]
        alive = not losses or run.handle_losses(losses)
        if alive:
            run.record_spare_faults()
            first_start = run.start_time is None
            for index in range(nodes):
                run.run_worker(index)
            for index in range(job.hot_spares):
                run.run_spare(index)
            if run.created_pods and first_start:
                run.start_time = format_time(now)
                run.event(
                    events.NORMAL,
                    events.CHILDREN_CREATED,
                    f"created {nodes} workers, {job.hot_spares} spares",
                )
            _update_running_conditions(run)

    if (run.created_pods or observed.ensure_base) and not _finished(run.conditions):
        base = [CreateObject(copy.deepcopy(m)) for m in job.renderer.base(run.excluded_names())]
        run.actions[:0] = base  # the Service and RBAC before the pods that need them

    offsets = run.fold()
    ready, _, spares = run.worker_counts()
    status = run.status(ready, spares)
    changed = _comparable(status) != _comparable(job.status)
    requeue = None
    if run.requeue is not None:
        requeue = max(0.5, (run.requeue - now).total_seconds())
    return Plan(
        status=status,
        status_changed=changed,
        actions=tuple(run.actions),
        events=tuple(run.events),
        requeue_after=requeue,
        offsets=offsets,
        counters=run.counters,
    )


def _update_running_conditions(run: _Pass) -> None:
    job = run.job
    ready, succeeded, _ = run.worker_counts()
    if succeeded == job.nodes:
        run.condition(events.COND_SUCCEEDED, True, events.JOB_SUCCEEDED, f"all {job.nodes} workers succeeded")
        run.condition(events.COND_READY, False, events.REASON_FINISHED, "the job succeeded")
        run.condition(events.COND_RECOVERING, False, events.REASON_FINISHED, "the job succeeded")
        run.event(events.NORMAL, events.JOB_SUCCEEDED, f"all {job.nodes} workers succeeded")
        run.completion_time = run.completion_time or format_time(run.now)
        run.remove_all_pods(roles=(constants.ROLE_SPARE,))
        return
    all_ready = ready + succeeded == job.nodes and ready > 0
    if all_ready:
        run.condition(
            events.COND_READY, True, events.REASON_ALL_WORKERS_READY, f"{ready}/{job.nodes} workers ready"
        )
        if condition_true(run.conditions, events.COND_RECOVERING):
            run.event(events.NORMAL, events.JOB_RECOVERED, f"all {job.nodes} workers are ready again")
            run.condition(events.COND_RECOVERING, False, events.JOB_RECOVERED, "all workers are ready again")
        elif not any(c.get("type") == events.COND_RECOVERING for c in run.conditions):
            run.condition(
                events.COND_RECOVERING, False, events.REASON_NO_FAULT, "no fault is being recovered"
            )
    else:
        run.condition(
            events.COND_READY, False, events.REASON_WORKERS_NOT_READY, f"{ready}/{job.nodes} workers ready"
        )
        if not any(c.get("type") == events.COND_RECOVERING for c in run.conditions):
            run.condition(
                events.COND_RECOVERING, False, events.REASON_NO_FAULT, "no fault is being recovered"
            )


def _reconcile_suspended(run: _Pass) -> None:
    if run.condition(events.COND_SUSPENDED, True, events.SUSPENDED, "spec.suspend is true"):
        run.event(events.NORMAL, events.SUSPENDED, "job suspended: workers and spares deleted, storage kept")
    run.condition(events.COND_READY, False, events.SUSPENDED, "the job is suspended")
    run.condition(events.COND_RECOVERING, False, events.SUSPENDED, "the job is suspended")
    run.remove_all_pods()
    for entry in run.entries.values():
        entry.update(state=SUSPENDED_STATE, nodeName="")


def _reconcile_finished(run: _Pass) -> None:
    job = run.job
    if condition_true(run.conditions, events.COND_FAILED):
        run.remove_all_pods()
        for entry in run.entries.values():
            pod = run.pods.get((entry["role"], entry["index"]))
            if pod is None:
                entry.update(state=FAILED if entry["role"] == constants.ROLE_WORKER else CREATING)
    else:
        run.remove_all_pods(roles=(constants.ROLE_SPARE,))
    for key in [k for k in run.entries if k[0] == constants.ROLE_SPARE]:
        if key not in run.pods:
            del run.entries[key]
    if job.ttl_seconds_after_finished is not None:
        finished_at = parse_time(run.completion_time) or run.now
        expiry = finished_at + timedelta(seconds=job.ttl_seconds_after_finished)
        if run.now >= expiry:
            run.actions.append(DeleteJob(job.name, job.namespace, job.uid))
            run.event(
                events.NORMAL,
                events.TTL_EXPIRED,
                f"deleting the job {job.ttl_seconds_after_finished}s after it finished",
            )
        else:
            run.at(expiry)


def _comparable(status: Mapping[str, Any]) -> dict[str, Any]:
    """Status without empty values, so that {} and absent compare equal (the API server prunes them)."""

    def clean(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(v) for k, v in value.items() if v not in (None, [], {})}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    result: dict[str, Any] = clean(status)
    return result


def reconcile_invalid(
    status: Mapping[str, Any], generation: int, message: str, now: datetime
) -> tuple[dict[str, Any], bool, tuple[Event, ...]]:
    """A job whose spec does not validate: Ready=False/InvalidSpec with the field-naming message.

    Returns (status, changed, events). The Warning is emitted only when the condition first flips (or
    its message changes) so that an invalid object does not flood the Events.
    """
    conditions = [dict(c) for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    before = next((c for c in conditions if c.get("type") == events.COND_READY), None)
    unchanged = (
        before is not None
        and before.get("reason") == events.INVALID_SPEC
        and before.get("message") == message
    )
    set_condition(
        conditions,
        events.COND_READY,
        status=False,
        reason=events.INVALID_SPEC,
        message=message,
        now=now,
        generation=generation,
    )
    new = dict(status)
    new["conditions"] = _sorted_conditions(conditions)
    new["observedGeneration"] = generation
    new["state"] = state_from_conditions(conditions)
    emitted = () if unchanged else (Event(events.WARNING, events.INVALID_SPEC, message),)
    return new, _comparable(new) != _comparable(status), emitted


def finalize(job: JobView, nodes: Mapping[str, Sequence[tuple[str, str, str]]]) -> tuple[Action, ...]:
    """What deleting a job does beyond ownerReference garbage collection.

    Children with ownerReferences go with the job. The checkpoint volume never carries one under
    `retentionPolicy: Retain`, so it survives; under `Delete` the claim (and a static volume) is
    deleted here. Taints this job put on excluded nodes are removed. `nodes` maps node name to its
    taints as (key, value, effect).
    """
    actions: list[Action] = []
    if job.retention_delete:
        for manifest in job.renderer.base([]):
            kind = manifest.get("kind")
            if kind in {"PersistentVolumeClaim", "PersistentVolume"}:
                metadata = manifest.get("metadata", {})
                namespace = metadata.get("namespace") if kind == "PersistentVolumeClaim" else None
                actions.append(
                    DeleteObject(str(manifest.get("apiVersion")), str(kind), metadata["name"], namespace)
                )
    for node, taints in sorted(nodes.items()):
        for key, value, effect in taints:
            if key == constants.TAINT_EXCLUDED and value == job.name:
                actions.append(TaintNode(node, key, value, effect, remove=True))
    return tuple(actions)
