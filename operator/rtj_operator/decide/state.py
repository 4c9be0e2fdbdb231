"""The typed state of one reconcile pass: the job's status being rewritten, and what was decided.

`PassState.begin` reads the job's status into its API models (`rtj_operator.api.status`: one
`PodStatus` entry per worker and spare, and per surge pod wanted (`decide.surges`), the node faults
and exclusions, the restart counts, the budget); the policy modules (`failures`, `placement`,
`lifecycle`, `surges`) change them and append actions and Events; `PassState.to_status` writes them
back in the status's JSON form. The helpers here are the few steps every policy shares: deleting a
pod, asking to look again later, judging a pod's node, setting a condition, finding a spare a
replacement may take.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from rtj_operator import constants, events
from rtj_operator.api import (
    BudgetStatus,
    CheckpointAdviceStatus,
    CheckpointStatus,
    Condition,
    ConditionStatus,
    EntryState,
    ExcludedNode,
    NodeFault,
    PodStatus,
    ProgressStatus,
    RecoveryStatus,
    ResilientTrainingJobStatus,
    RestartsStatus,
    WorkersStatus,
)
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.actions import FORCE, GRACEFUL_DELETE_SECONDS, Action, DeletePod, Event
from rtj_operator.decide.node_problems import NodeProblem, node_disruption, node_health_problem, node_problem
from rtj_operator.nodehealth import NodeHealth
from rtj_operator.observe import JobView, NodeState, Observed, PodState
from rtj_operator.progress import FoldedProgress

WORKER, SPARE, STORE = constants.ROLE_WORKER, constants.ROLE_SPARE, constants.ROLE_STORE
SURGE = constants.ROLE_SURGE
# The store pod's key (faultTolerance.launcher Supervisor): one per job.
STORE_KEY = (STORE, 0)
EntryKey = tuple[str, int]  # (role, index)
# What a pass counts for the metrics (`Plan.counters`).
COUNTERS = ("node_losses", "pod_replacements", "gang_restarts", "surges_created", "surges_used")


def entries_per_role(job: JobView) -> dict[str, int]:
    """How many pods (and status entries) of each role the job has room for: index 0 up to this."""
    return {WORKER: job.nodes, SPARE: job.hot_spares, SURGE: job.nodes, STORE: 1 if job.store_pod else 0}


def _avoided_now(node: NodeState, health: NodeHealth) -> bool:
    """Whether new pods are kept off the node for now: a health signal or a planned disruption."""
    return node_health_problem(node, health) is not None or node_disruption(node, health) is not None


@dataclass
class PassState:
    """One pass over one job: the inputs, the status being rewritten, and the decisions so far."""

    job: JobView
    observed: Observed
    now: datetime
    # The status, in its API models.
    conditions: list[Condition]
    restarts: RestartsStatus
    budget: BudgetStatus
    excluded: list[ExcludedNode]
    faults: list[NodeFault]
    entries: dict[EntryKey, PodStatus]
    start_time: str | None
    completion_time: str | None
    progress: ProgressStatus | None  # folded from the pods' reports (progress.fold_progress)
    last_checkpoint: CheckpointStatus | None
    last_recovery: RecoveryStatus | None  # the newest ended recovery (decide.training)
    checkpoint_advice: CheckpointAdviceStatus | None  # the advised interval (decide.checkpoint_advice)
    # The job's pods by (role, index); pods with an index beyond spec (`stray`) are only removed.
    pods: dict[EntryKey, PodState]
    stray: list[PodState]
    # What was decided.
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue: datetime | None = None
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    created_pods: bool = False
    holding: bool = False  # creates held back after the API server refused a child (decide.admission)
    faulted_nodes: set[str] = field(default_factory=set)  # a node's fault counts once per pass
    spares_taken: set[int] = field(default_factory=set)  # spares given up for replacements
    # Workers this pass decided to replace one by one (a loss, not a gang restart): `surges` may ask
    # early for their replacements' nodes.
    replaced_alone: set[int] = field(default_factory=set)
    # What the fold of the workers' progress reports found this pass (reconciler._fold_progress).
    folded: FoldedProgress | None = None

    @classmethod
    def begin(cls, job: JobView, observed: Observed, now: datetime) -> PassState:
        status = ResilientTrainingJobStatus.read(job.status)  # new objects: the view is left as it was
        entries = {
            (entry.role, entry.index): entry
            for entry in (status.workers.pods if status.workers is not None else [])
            if entry.role in (WORKER, SPARE, SURGE)
        }
        if status.store is not None and status.store.index == 0:
            entries[STORE_KEY] = status.store
        pods: dict[EntryKey, PodState] = {}
        stray: list[PodState] = []
        for pod in observed.pods:
            if pod.name != job.pod_name(pod.role, pod.index):
                continue  # not a name this job creates: someone else's pod carrying our labels
            if pod.index >= entries_per_role(job)[pod.role]:
                stray.append(pod)
            else:
                pods[(pod.role, pod.index)] = pod
        restarts = status.restarts or RestartsStatus()
        return cls(
            job=job,
            observed=observed,
            now=now,
            conditions=status.conditions,
            restarts=restarts,
            # A status written before the failure policy had classes has no budget: every replacement
            # was charged then.
            budget=status.budget or BudgetStatus(failures_used=restarts.pod_replacement),
            excluded=status.excluded_nodes,
            faults=status.node_faults,
            entries=entries,
            start_time=status.start_time,
            completion_time=status.completion_time,
            progress=status.progress,
            last_checkpoint=status.last_checkpoint,
            last_recovery=status.last_recovery,
            checkpoint_advice=status.checkpoint_advice,
            pods=pods,
            stray=stray,
        )

    # -- shared steps --

    def at(self, moment: datetime) -> None:
        """Ask to be reconciled again at `moment` (the earliest one wins)."""
        if self.requeue is None or moment < self.requeue:
            self.requeue = moment

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def condition(self, type_: str, status: bool | ConditionStatus, reason: str, message: str) -> bool:
        """Set a condition for this pass's generation; returns whether its status flipped."""
        return cond.set_condition(
            self.conditions,
            type_,
            status=status,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.job.generation,
        )

    def problem(self, pod: PodState) -> NodeProblem | None:
        """What is wrong with the pod's node now; asks to look again when it may go wrong later."""
        found, recheck = node_problem(
            pod.node_name,
            self.observed.nodes,
            pod.tolerations,
            self.now,
            self.job.policy.node_loss_grace_seconds,
            health=self.observed.health,
            pod=pod,
        )
        if recheck is not None:
            self.at(recheck)
        return found

    def excluded_names(self, *, not_ready: bool = True) -> list[str]:
        """The job's excluded nodes and, unless `not_ready` is False, the nodes not Ready right now.

        A worker is kept off NotReady nodes too: a replacement must not land on the node that was
        just lost while it flaps. A spare is not: it waits in Pending for a node, and a required
        affinity does not change once the pod exists, so a NotReady node named in it would stay
        barred after it recovered (the scheduler already avoids NotReady nodes by their taints).
        """
        names = {e.node_name for e in self.excluded if e.node_name}
        if not_ready:
            names |= self._avoided_nodes
        return sorted(names)

    @functools.cached_property
    def _avoided_nodes(self) -> frozenset[str]:
        """The nodes not Ready now, and those that show a health signal (a condition, label, taint)
        or a planned disruption (a cordon, a maintenance taint) now: like NotReady, a passing state
        that must not bar a waiting spare once it clears. Once per pass: the observations do not
        change within one, and every worker's placement asks (1,000 workers times 1,100 nodes)."""
        health = self.observed.health
        return frozenset(
            n.name for n in self.observed.nodes.values() if n.ready != "True" or _avoided_now(n, health)
        )

    def note_reported_faults(self) -> None:
        """Keep, per node, the most faults a worker's trainer attributed to it (status.nodeFaults[]
        .reportedFaults): the trainer counts across its restarts on one node, so the count only grows."""
        for pod in self.pods.values():
            faults = pod.report.node_faults if pod.report is not None else None
            if faults is None or not faults.count or faults.node != pod.node_name:
                continue
            record = next((f for f in self.faults if f.node_name == pod.node_name), None)
            if record is None:
                record = NodeFault(node_name=pod.node_name)
                self.faults.append(record)
            record.reported_faults = max(record.reported_faults, faults.count)

    def entry(self, role: str, index: int) -> PodStatus:
        key = (role, index)
        if key not in self.entries:
            self.entries[key] = PodStatus(role=role, index=index, pod_name=self.job.pod_name(role, index))
        return self.entries[key]

    def pod(self, role: str, index: int) -> PodState | None:
        return self.pods.get((role, index))

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

    def remove_pod(self, pod: PodState) -> None:
        """Delete a pod; force only where no kubelet will end it (`NodeProblem.kubelet_gone`)."""
        problem = self.problem(pod)
        self.delete_pod(pod, force=problem is not None and problem.kubelet_gone)

    def remove_all_pods(self, *, roles: Sequence[str] = (WORKER, SPARE, STORE, SURGE)) -> None:
        """Delete the pods of `roles` (force on a dead node) and every stray pod; succeeded ones stay."""
        for (role, _), pod in sorted(self.pods.items()):
            if role in roles and pod.phase not in {"Succeeded"}:
                self.remove_pod(pod)
        for pod in self.stray:
            self.remove_pod(pod)

    # -- the status written back --

    def worker_counts(self) -> tuple[int, int, int]:
        """(ready workers, succeeded workers, ready spares)."""
        nodes, spares = self.job.nodes, self.job.hot_spares
        ready = sum(
            1
            for i in range(nodes)
            if (p := self.pod(WORKER, i)) is not None
            and p.ready
            and p.phase == "Running"
            and not p.deleting
            and self.entry(WORKER, i).state == EntryState.RUNNING
        )
        succeeded = sum(1 for i in range(nodes) if self.entry(WORKER, i).state == EntryState.SUCCEEDED)
        ready_spares = sum(
            1 for k in range(spares) if (p := self.pod(SPARE, k)) is not None and p.ready and not p.deleting
        )
        return ready, succeeded, ready_spares

    def to_status(self) -> ResilientTrainingJobStatus:
        ready, _, spares = self.worker_counts()
        # Workers first, then spares, then surges, each by index.
        ordered = sorted(
            (k for k in self.entries if k != STORE_KEY), key=lambda k: (k[0] != WORKER, k[0], k[1])
        )
        return ResilientTrainingJobStatus(
            observed_generation=self.job.generation,
            state=cond.state_from_conditions(self.conditions),
            conditions=cond.sorted_conditions(self.conditions),
            workers=WorkersStatus(
                desired=self.job.nodes,
                ready=ready,
                ready_spares=spares,
                ready_text=f"{ready}/{self.job.nodes}",
                pods=[self.entries[k] for k in ordered],
            ),
            store=self.entries.get(STORE_KEY),
            restarts=self.restarts.counted(),
            budget=self.budget if self.budget != BudgetStatus() else None,
            excluded_nodes=self.excluded,
            node_faults=self.faults,
            start_time=self.start_time,
            completion_time=self.completion_time,
            progress=self.progress,
            last_checkpoint=self.last_checkpoint,
            last_recovery=self.last_recovery,
            checkpoint_advice=self.checkpoint_advice,
        )


# -- steps of several policies, on the pass state --


def discard_pod(run: PassState, key: EntryKey) -> PodState | None:
    """Delete the pod of `key` (force on a dead node) and forget it for the rest of the pass, so that
    it is deleted once; the pod, if there was one."""
    pod = run.pods.pop(key, None)
    if pod is not None:
        run.remove_pod(pod)
    return pod


def drop_surges(run: PassState) -> None:
    """Delete every surge pod and forget every surge wanted (`decide.surges`): a job that stops
    (suspended, finished, failed) or restarts its gang replaces no worker on a surge's node."""
    for key in sorted(k for k in run.pods if k[0] == SURGE):
        discard_pod(run, key)
    for key in [k for k in run.entries if k[0] == SURGE]:
        del run.entries[key]


def holds_fit_node(run: PassState, pod: PodState, excluded: Sequence[str]) -> bool:
    """Whether `pod` (a spare or a surge pod) runs, ready, on a node a replacement may be pinned to:
    not being deleted, the node not in `excluded` and showing no problem."""
    if pod.deleting or not pod.ready or pod.phase != "Running" or not pod.node_name:
        return False
    return pod.node_name not in excluded and run.problem(pod) is None


def spares_to_take(run: PassState, excluded: Sequence[str]) -> list[tuple[int, PodState]]:
    """The ready hot spares on fit nodes (`holds_fit_node`) that replacements may take, with their
    indices, in order; never one that takes part in the training (Supervisor's reserve ranks,
    FtLauncher's standby node, which may already hold the lost worker's rank)."""
    if run.job.spares_in_training:
        return []
    spares = ((k, run.pod(SPARE, k)) for k in range(run.job.hot_spares))
    return [(k, pod) for k, pod in spares if pod is not None and holds_fit_node(run, pod, excluded)]


def pinned_nodes(run: PassState, *, except_index: int | None = None) -> set[str]:
    """Nodes that replacement workers still being created are pinned to (a spare's or a surge's)."""
    return {
        e.node_name
        for e in run.entries.values()
        if e.role == WORKER and e.state == EntryState.CREATING and e.node_name and e.index != except_index
    }
