"""Failure handling and budgets: which worker was lost, what it costs, and which nodes to avoid.

A fault is counted only when an entry recorded Pending/Running on a node (`Entry.on_node`) meets a
lost, failed or disrupted pod, and the same status write moves the entry to `Replacing`: a crash
after that write resumes from `Replacing` without counting again; a crash before it counted nothing.

- `detect_losses`: the workers lost since the last pass, and why (`Loss`).
- `handle_losses`: count them against `failurePolicy.maxNodeReplacements` (or fail the job), record
  node faults, and choose the scope: the lost workers, or every worker (a gang restart) when worker 0
  (the rendezvous host) was lost or a worker's processes failed.
- `record_node_fault`: a node's fault history; a deleted node or a repeat offender is excluded for
  the job (and, opt-in, tainted cluster-wide).
- `record_spare_faults`: the spares' nodes are judged before any pod is created in the pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from rtj_operator import constants, events
from rtj_operator.api import EntryState
from rtj_operator.decide.actions import TaintNode
from rtj_operator.decide.state import SPARE, WORKER, Entry, ExcludedNodeRecord, NodeFaultRecord, PassState
from rtj_operator.observe import NodeProblem, PodState
from rtj_operator.progress import format_time

# Pod status reasons that say the pod was pushed off its node, not that its processes failed.
DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "Terminated", "Shutdown"})
# DisruptionTarget reasons that put the blame on the node.
NODE_BLAMED_DISRUPTIONS = frozenset({"DeletionByTaintManager", "TerminationByKubelet"})


@dataclass(frozen=True)
class Loss:
    """A worker lost since the last pass."""

    index: int
    pod: PodState | None  # None when the pod is gone
    reason: str  # an event reason: NodeLost, WorkerDisrupted, WorkerFailed
    message: str
    node_problem: NodeProblem | None  # set when the node is to blame


def detect_losses(run: PassState) -> list[Loss]:
    found = (detect_loss(run, index) for index in range(run.job.nodes))
    return [loss for loss in found if loss is not None]


def detect_loss(run: PassState, index: int) -> Loss | None:
    """The loss of worker `index`, if its entry is recorded on a node and its pod is gone or faulty."""
    entry = run.entry(WORKER, index)
    pod = run.pod(WORKER, index)
    if pod is None:
        return _pod_gone(run, entry) if entry.on_node else None
    # Only a pod recorded on its node can be lost: a pod still `Creating` in status is recorded by
    # this pass (placement.run_worker) and its faults count from the next pass on.
    if not entry.on_node or pod.node_name != entry.node_name or pod.phase == "Succeeded":
        return None
    return _pod_faulty(run, index, pod)


def _pod_gone(run: PassState, entry: Entry) -> Loss:
    if entry.node_name not in run.observed.nodes:
        gone = NodeProblem("NodeDeleted", f"node {entry.node_name} was deleted", permanent=True)
        return Loss(entry.index, None, events.NODE_LOST, gone.message, gone)
    return Loss(entry.index, None, events.WORKER_DISRUPTED, f"worker pod {entry.pod_name} was deleted", None)


def _pod_faulty(run: PassState, index: int, pod: PodState) -> Loss | None:
    problem = run.problem(pod)
    if problem is not None:
        return Loss(index, pod, events.NODE_LOST, problem.message, problem)
    if pod.disruption or pod.status_reason in DISRUPTION_REASONS:
        cause = pod.disruption or pod.status_reason
        node_blamed = NodeProblem(cause, f"pod {pod.name} disrupted on {pod.node_name}: {cause}")
        return Loss(
            index,
            pod,
            events.WORKER_DISRUPTED,
            f"worker pod {pod.name} was disrupted ({cause})",
            node_blamed if cause in NODE_BLAMED_DISRUPTIONS else None,
        )
    if pod.deleting:
        return Loss(index, pod, events.WORKER_DISRUPTED, f"worker pod {pod.name} was deleted", None)
    if pod.phase == "Failed":
        detail = f": {pod.message}" if pod.message else ""
        return Loss(index, pod, events.WORKER_FAILED, f"worker pod {pod.name} failed{detail}", None)
    return None


def handle_losses(run: PassState, losses: list[Loss]) -> bool:
    """Count the losses, exclude nodes, pick the restart scope. False when the budget is exhausted."""
    process_failures = [loss for loss in losses if loss.reason == events.WORKER_FAILED]
    node_or_disruption = [loss for loss in losses if loss.reason != events.WORKER_FAILED]
    # Worker 0 hosts the c10d rendezvous store: without it the survivors cannot re-rendezvous. A
    # pod that exited non-zero on a healthy node means its ft_launcher gave up: the processes, not
    # the node, failed, and only a fresh start of every pod brings the job back.
    gang = bool(process_failures) or any(loss.index == 0 for loss in losses)
    count = len(node_or_disruption) if node_or_disruption else 1
    for loss in losses:
        run.event(events.WARNING, loss.reason, loss.message)
        if loss.node_problem is not None:
            node = loss.pod.node_name if loss.pod else run.entry(WORKER, loss.index).node_name
            record_node_fault(run, node, loss.node_problem)
            if loss.reason == events.NODE_LOST:
                run.counters["node_losses"] += 1
    if run.restarts.pod_replacement + count > run.job.policy.max_node_replacements:
        _fail_budget(run, losses)
        return False
    run.restarts.pod_replacement += count
    run.counters["pod_replacements"] += count
    lead = losses[0]
    run.condition(events.COND_RECOVERING, True, lead.reason, lead.message)
    if gang:
        run.counters["gang_restarts"] += 1
        why = (
            "worker 0 (the rendezvous host) was lost"
            if any(loss.index == 0 for loss in node_or_disruption)
            else "a worker's processes failed"
        )
        run.event(events.WARNING, events.GANG_RESTART, f"restarting all {run.job.nodes} workers: {why}")
        replaced = list(range(run.job.nodes))
    else:
        replaced = [loss.index for loss in losses]
    for index in replaced:
        run.entry(WORKER, index).state = EntryState.REPLACING
    return True


def _fail_budget(run: PassState, losses: list[Loss]) -> None:
    budget = run.job.policy.max_node_replacements
    message = (
        f"{run.restarts.pod_replacement} of {budget} pod replacements used; "
        f"not replacing after: {losses[0].message}"
    )
    run.condition(events.COND_FAILED, True, events.RESTART_BUDGET_EXHAUSTED, message)
    run.event(events.WARNING, events.RESTART_BUDGET_EXHAUSTED, message)
    run.completion_time = run.completion_time or format_time(run.now)
    run.remove_all_pods()


def record_node_fault(run: PassState, node: str, problem: NodeProblem) -> None:
    """Count a fault on `node` (once per pass) and exclude the node when it is gone or a repeat offender."""
    if not node or node in run.faulted_nodes:
        return
    run.faulted_nodes.add(node)
    record = next((f for f in run.faults if f.node_name == node), None)
    if record is None:
        record = NodeFaultRecord(node)
        run.faults.append(record)
    record.count += 1
    record.last_reason = problem.reason
    record.last_time = format_time(run.now)
    if any(e.node_name == node for e in run.excluded):
        return
    threshold = run.job.policy.repeat_offender_threshold
    if problem.permanent or record.count >= threshold:
        _exclude(run, node, problem, record, threshold)


def _exclude(
    run: PassState, node: str, problem: NodeProblem, record: NodeFaultRecord, threshold: int
) -> None:
    why = problem.reason if problem.permanent else "RepeatOffender"
    run.excluded.append(ExcludedNodeRecord(node, why, format_time(run.now)))
    detail = "it was deleted" if problem.permanent else f"{record.count} faults (threshold {threshold})"
    run.event(events.WARNING, events.NODE_EXCLUDED, f"node {node} excluded for this job: {detail}")
    if run.job.policy.taint_excluded_nodes and node in run.observed.nodes:
        run.actions.append(TaintNode(node, constants.TAINT_EXCLUDED, run.job.name, "NoSchedule"))
        run.event(
            events.NORMAL,
            events.NODE_TAINTED,
            f"node {node} tainted {constants.TAINT_EXCLUDED}={run.job.name}:NoSchedule",
        )


def record_spare_faults(run: PassState) -> None:
    """Count faults of the spares' nodes before any pod is created, so every pod created in this
    pass is kept off a node excluded in it."""
    for k in range(run.job.hot_spares):
        pod = run.pod(SPARE, k)
        entry = run.entry(SPARE, k)
        if pod is None or not entry.on_node or entry.node_name != pod.node_name:
            continue
        problem = run.problem(pod)
        if problem is not None:
            record_node_fault(run, pod.node_name, problem)
