"""Failure handling and budgets: which worker was lost, how the failure policy judges it, and which
nodes to avoid.

A fault is counted only when an entry recorded Pending/Running on a node (`PodStatus.on_node`) meets a
lost, failed or disrupted pod, and the same status write moves the entry to `Replacing`: a crash
after that write resumes from `Replacing` without counting again; a crash before it counted nothing.

- `detect_losses`: the workers lost since the last pass, and why (`Loss`). A worker that failed while
  another worker's node is NotReady (within its grace period) is held back until that node's fate is
  known: its failure is most likely that node's loss seen from the other side.
- A planned disruption (`rtj_operator.disruptions`: an eviction, a preemption, a graceful shutdown,
  and a worker that exited `PEER_DRAINED_EXIT_CODE` after another pod's drain) is a Disruption: its
  node's fault only when its signal blames the node (`disruptions.blames_node`).
- `judge`: each loss's fault class (NodeLoss, ProcessFailure, Disruption) and the action of the first
  `failurePolicy.rules` entry that matches it, else FailJob for a worker whose launcher said its
  command cannot start (`decide.startup`) or fails at the same step on every try (`decide.repeated`),
  else the class's default (`Verdict`).
- `handle_losses`: fail the job on a FailJob verdict or a worker that failed the same way before any
  step too often (`decide.startup`), else charge the verdicts against
  `failurePolicy.maxNodeReplacements` and the windowed `budgets` (or fail the job), record node
  faults, grow the backoff series, and choose the scope: the lost workers, or every worker (a gang
  restart) when worker 0 hosting the rendezvous (FtLauncher without a store pod) was lost or the
  action is RestartJob (a process failure's default). A failed job is `Ready=False` and
  `Recovering=False` in the same pass. Workers replaced one by one may get a surge pod
  (`decide.surges`); a gang restart drops every surge.
- With a store pod (`faultTolerance.launcher` Supervisor, or FtLauncher with `rendezvous.host`
  StorePod) no worker hosts anything: worker 0's loss is one worker's like any other (under Supervisor
  its ranks are taken over in-process by reserve ranks and the replacement pod stands by; under
  FtLauncher the next rendezvous round takes the replacement in). The world's stores or the
  rendezvous live in the store pod instead, whose loss (`detect_store_loss`) is judged by its class
  but always restarts the gang; a gang restart there also recreates the store and, under Supervisor,
  the spares (their reserve ranks belong to the broken world).
- `attribute_late_node_losses`: a worker already being replaced (a gang restart after a process
  failure) whose old pod turns out to sit on a lost node: the node's loss is recorded then.
- `record_node_fault`: a node's fault history; a deleted node or a repeat offender is excluded for
  the job (and, opt-in, tainted cluster-wide).
- `record_spare_faults`: the spares' nodes are judged before any pod is created in the pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from rtj_contract import termination
from rtj_contract.times import format_rfc3339, parse_rfc3339

from rtj_operator import constants, disruptions, events
from rtj_operator.api import (
    ConditionStatus,
    EntryState,
    ExcludedNode,
    ExitCodeOperator,
    FailureAction,
    FailureRule,
    FaultClass,
    NodeFault,
    PodStatus,
    RecentFault,
)
from rtj_operator.decide import conditions as cond
from rtj_operator.decide import repeated, startup
from rtj_operator.decide.actions import TaintNode
from rtj_operator.decide.node_problems import NodeProblem, node_disruption
from rtj_operator.decide.state import (
    SPARE,
    STORE,
    STORE_KEY,
    WORKER,
    PassState,
    drop_surges,
)
from rtj_operator.observe import PodState


@dataclass(frozen=True)
class Loss:
    """A worker (or, under Supervisor, the store pod) lost since the last pass."""

    index: int
    pod: PodState | None  # None when the pod is gone
    reason: str  # an event reason: NodeLost, WorkerDisrupted, WorkerFailed
    message: str
    node_problem: NodeProblem | None  # set when the node is to blame
    role: str = WORKER

    @property
    def event_reason(self) -> str:
        """The Event's reason: the store pod's loss is a StoreLost whatever its class."""
        return events.STORE_LOST if self.role == STORE else self.reason


def detect_losses(run: PassState) -> list[Loss]:
    found = [detect_loss(run, index) for index in range(run.job.nodes)]
    if run.job.store_pod:
        found.append(detect_store_loss(run))
    losses = [loss for loss in found if loss is not None]
    failed = {loss.index for loss in losses if loss.reason == events.WORKER_FAILED}
    if failed and _peer_node_in_doubt(run, failed):
        # Judged once the doubtful node is lost (a NodeLost; the failures are its consequence) or
        # Ready again (then they are the workers' own). `run.problem` asked to be woken in time.
        return [loss for loss in losses if loss.reason != events.WORKER_FAILED]
    return losses


def _peer_node_in_doubt(run: PassState, failed: set[int]) -> bool:
    """Whether another worker's node (or the store pod's) is not Ready but still within
    nodeLossGraceSeconds."""
    keys = [(WORKER, index) for index in range(run.job.nodes) if index not in failed]
    if run.job.store_pod:
        keys.append(STORE_KEY)
    for role, index in keys:
        entry, pod = run.entry(role, index), run.pod(role, index)
        if pod is None or not entry.on_node or pod.node_name != entry.node_name:
            continue
        node = run.observed.nodes.get(pod.node_name)
        if node is not None and node.ready != "True" and run.problem(pod) is None:
            return True
    return False


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
    return _pod_faulty(run, entry, pod)


def detect_store_loss(run: PassState) -> Loss | None:
    """The loss of the store pod (Supervisor): gone, failed, disrupted, or its node lost. A store that
    exits zero while the job runs has left the world without its stores too: a failure."""
    entry, pod = run.entry(*STORE_KEY), run.pod(*STORE_KEY)
    if pod is None:
        return _pod_gone(run, entry) if entry.on_node else None
    if not entry.on_node or pod.node_name != entry.node_name:
        return None
    if pod.phase == "Succeeded" and run.problem(pod) is None:
        return Loss(0, pod, events.WORKER_FAILED, f"store pod {pod.name} exited", None, STORE)
    return _pod_faulty(run, entry, pod)


def _pod_gone(run: PassState, entry: PodStatus) -> Loss:
    if entry.node_name not in run.observed.nodes:
        gone = NodeProblem("NodeDeleted", f"node {entry.node_name} was deleted", permanent=True)
        return Loss(entry.index, None, events.NODE_LOST, gone.message, gone, entry.role)
    message = f"{entry.role} pod {entry.pod_name} was deleted"
    return Loss(entry.index, None, events.WORKER_DISRUPTED, message, None, entry.role)


def _pod_faulty(run: PassState, entry: PodStatus, pod: PodState) -> Loss | None:
    index, role = entry.index, entry.role
    problem = run.problem(pod)
    if problem is not None:
        return Loss(index, pod, events.NODE_LOST, problem.message, problem, role)
    if disruptions.is_pod_disruption(pod.disruption, pod.status_reason):
        cause = pod.disruption or pod.status_reason
        return Loss(
            index,
            pod,
            events.WORKER_DISRUPTED,
            f"{role} pod {pod.name} was disrupted ({cause})",
            _node_blamed(run, pod, cause),
            role,
        )
    if pod.deleting:
        return Loss(index, pod, events.WORKER_DISRUPTED, f"{role} pod {pod.name} was deleted", None, role)
    if left_for_a_peers_drain(pod):
        message = f"{role} pod {pod.name} left after another pod's drain (exit {pod.exit_code})"
        return Loss(index, pod, events.WORKER_DISRUPTED, message, None, role)
    if pod.phase == "Failed":
        detail = f": {pod.message}" if pod.message else ""
        return Loss(index, pod, events.WORKER_FAILED, f"{role} pod {pod.name} failed{detail}", None, role)
    return None


def _node_blamed(run: PassState, pod: PodState, cause: str) -> NodeProblem | None:
    """The node's fault behind a pod disruption, if the node is to blame (`disruptions.blames_node`)."""
    node = run.observed.nodes.get(pod.node_name)
    planned = node is not None and node_disruption(node, run.observed.health) is not None
    if not disruptions.blames_node(pod.disruption, pod.status_reason, node_in_maintenance=planned):
        return None
    return NodeProblem(cause, f"pod {pod.name} disrupted on {pod.node_name}: {cause}")


def left_for_a_peers_drain(pod: PodState | None) -> bool:
    """A pod that failed because another pod of the job is draining (`PEER_DRAINED_EXIT_CODE`): the
    drain's consequence, a disruption, though only a gang restart brings its world back."""
    return pod is not None and pod.phase == "Failed" and pod.exit_code == termination.PEER_DRAINED_EXIT_CODE


@dataclass(frozen=True)
class Verdict:
    """How the failure policy judges one loss."""

    loss: Loss
    fault_class: FaultClass
    action: FailureAction  # the rule's, or the class's default
    rule: int | None  # the index of the matching rule in failurePolicy.rules


DEFAULT_ACTIONS: dict[FaultClass, FailureAction] = {
    # Only a fresh start of every pod brings back a job one of whose launchers gave up.
    FaultClass.PROCESS_FAILURE: FailureAction.RESTART_JOB,
    FaultClass.NODE_LOSS: FailureAction.REPLACE_WORKER,
    FaultClass.DISRUPTION: FailureAction.REPLACE_WORKER,
}


def fault_class(loss: Loss) -> FaultClass:
    if loss.reason == events.NODE_LOST:
        return FaultClass.NODE_LOSS
    if loss.reason == events.WORKER_FAILED:
        return FaultClass.PROCESS_FAILURE
    return FaultClass.DISRUPTION


def rule_matches(rule: FailureRule, cls: FaultClass, pod: PodState | None) -> bool:
    """Whether `rule` matches a loss of class `cls` whose pod (if still there) is `pod`."""
    if pod is None:
        return False
    if rule.on_exit_codes is not None:
        # An exit after another pod's drain is a Disruption, still told by its exit code.
        exited = cls == FaultClass.PROCESS_FAILURE or left_for_a_peers_drain(pod)
        if not exited or pod.exit_code is None:
            return False
        inside = pod.exit_code in rule.on_exit_codes.values
        return inside if rule.on_exit_codes.operator == ExitCodeOperator.IN else not inside
    if rule.on_fault_reasons is not None:
        return cls == FaultClass.PROCESS_FAILURE and pod.fault_reason in rule.on_fault_reasons
    if rule.on_disruption_reasons is not None:
        reasons = {pod.disruption or "", pod.status_reason}
        return cls == FaultClass.DISRUPTION and bool(reasons & set(rule.on_disruption_reasons))
    return False


def judge(run: PassState, loss: Loss) -> Verdict:
    cls = fault_class(loss)
    if loss.role == STORE:
        # The rules judge workers' faults; without its stores no worker can go on, and a store that
        # said it cannot serve as configured (rtj-store's StartupFailed) comes up no better next time.
        gave_up = cls == FaultClass.PROCESS_FAILURE and startup.launcher_gave_up(loss.pod)
        return Verdict(loss, cls, FailureAction.FAIL_JOB if gave_up else FailureAction.RESTART_JOB, None)
    for number, rule in enumerate(run.job.model.spec.failure_policy.rules):
        if rule_matches(rule, cls, loss.pod):
            return Verdict(loss, cls, rule.action, number)
    if cls == FaultClass.PROCESS_FAILURE and startup.launcher_gave_up(loss.pod):
        return Verdict(loss, cls, FailureAction.FAIL_JOB, None)  # no restart brings it up
    if cls == FaultClass.PROCESS_FAILURE and repeated.launcher_stopped(loss.pod):
        return Verdict(loss, cls, FailureAction.FAIL_JOB, None)  # no restart gets past that step
    if cls == FaultClass.DISRUPTION and left_for_a_peers_drain(loss.pod):
        return Verdict(loss, cls, FailureAction.RESTART_JOB, None)  # its world is gone
    return Verdict(loss, cls, DEFAULT_ACTIONS[cls], None)


def handle_losses(run: PassState, losses: list[Loss]) -> bool:
    """Judge and count the losses, exclude nodes, pick the restart scope. False when the job failed."""
    verdicts = _consequences_apart([judge(run, loss) for loss in losses])
    for verdict in verdicts:
        loss = verdict.loss
        run.event(events.WARNING, loss.event_reason, loss.message)
        if loss.node_problem is not None:
            node = loss.pod.node_name if loss.pod else run.entry(loss.role, loss.index).node_name
            record_node_fault(run, node, loss.node_problem)
            if loss.reason == events.NODE_LOST:
                run.counters["node_losses"] += 1
    repeated = _record_start_failures(run, verdicts)
    fatal = next((v for v in verdicts if v.action == FailureAction.FAIL_JOB), None)
    if fatal is not None:
        _fail_fatal(run, fatal)
        return False
    if repeated is not None:
        _fail(run, events.STARTUP_FAILED, repeated)
        return False
    charged = _charged_units(verdicts)
    if not _within_budgets(run, verdicts, charged):
        return False
    _count(run, charged)
    lead = verdicts[0].loss
    run.condition(cond.COND_RECOVERING, True, lead.event_reason, lead.message)
    _choose_scope(run, verdicts)
    return True


def _record_start_failures(run: PassState, verdicts: list[Verdict]) -> str | None:
    """Each lost worker's failure in its series of failed starts (`decide.startup`); the message that
    fails the job when one worker's series is long enough."""
    failed = None
    for verdict in verdicts:
        loss = verdict.loss
        if loss.role != WORKER:
            continue
        # Only the worker's own failure as the default policy judges it; a rule's or a consequence's
        # (replaced, not restarted: `_consequences_apart`) ends the series.
        own = verdict.fault_class == FaultClass.PROCESS_FAILURE and verdict.rule is None
        counts = own and verdict.action == DEFAULT_ACTIONS[FaultClass.PROCESS_FAILURE]
        failed = startup.record_start_failure(run, loss.index, loss.pod, counts=counts) or failed
    return failed


def _consequences_apart(verdicts: list[Verdict]) -> list[Verdict]:
    """Process failures met in the same pass as a node loss or disruption are its consequence (the
    survivors' launchers lose their peer): no rule judges them, their pods are only replaced."""
    if all(v.fault_class == FaultClass.PROCESS_FAILURE for v in verdicts):
        return verdicts
    return [
        Verdict(v.loss, v.fault_class, FailureAction.REPLACE_WORKER, None)
        if v.fault_class == FaultClass.PROCESS_FAILURE
        else v
        for v in verdicts
    ]


def _charged_units(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts that count as one replacement each.

    A process failure met in the same pass as a node loss or disruption is its consequence (the
    survivors' launchers lose their peer) and counts nothing of its own; process failures alone
    count once, however many pods failed: one gang restart recovers them all.
    """
    others = [v for v in verdicts if v.fault_class != FaultClass.PROCESS_FAILURE]
    if others:
        return others
    counted = [v for v in verdicts if v.action != FailureAction.IGNORE]
    return counted[:1] or verdicts[:1]


def _charges_failure(run: PassState, verdict: Verdict) -> bool:
    """Whether a counted unit consumes maxNodeReplacements."""
    if verdict.action == FailureAction.IGNORE:
        return False
    return verdict.fault_class != FaultClass.DISRUPTION or run.job.model.spec.failure_policy.count_disruptions


def _within_budgets(run: PassState, verdicts: list[Verdict], charged: list[Verdict]) -> bool:
    policy = run.job.model.spec.failure_policy
    failures = sum(1 for v in charged if _charges_failure(run, v))
    if failures and run.budget.failures_used + failures > policy.max_node_replacements:
        used = run.budget.failures_used
        limit = policy.max_node_replacements
        _fail_budget(run, f"{used} of {limit} pod replacements for failures used", verdicts)
        return False
    _forget_old_faults(run)
    for budget in policy.budgets:
        new = sum(
            1 for v in charged if v.fault_class == budget.fault_class and v.action != FailureAction.IGNORE
        )
        if not new:
            continue
        recent = sum(1 for fault in run.budget.recent_faults if fault.fault_class == budget.fault_class)
        if recent + new > budget.max_restarts:
            _fail_budget(
                run,
                f"{recent} {budget.fault_class} faults within {budget.window_seconds} s "
                f"(budget {budget.max_restarts})",
                verdicts,
            )
            return False
    return True


def _forget_old_faults(run: PassState) -> None:
    """Keep only the recent faults still inside their class's window (a class without a budget: none)."""
    windows = {b.fault_class.value: b.window_seconds for b in run.job.model.spec.failure_policy.budgets}
    kept = []
    for fault in run.budget.recent_faults:
        moment, window = parse_rfc3339(fault.time), windows.get(fault.fault_class)
        if window is not None and moment is not None and run.now - moment < timedelta(seconds=window):
            kept.append(fault)
    run.budget.recent_faults = kept


def _count(run: PassState, charged: list[Verdict]) -> None:
    windowed = {b.fault_class for b in run.job.model.spec.failure_policy.budgets}
    counted = [v for v in charged if v.action != FailureAction.IGNORE]
    run.budget.failures_used += sum(1 for v in charged if _charges_failure(run, v))
    run.budget.disruptions += sum(1 for v in counted if v.fault_class == FaultClass.DISRUPTION)
    run.budget.ignored += len(charged) - len(counted)
    run.budget.recent_faults += [
        RecentFault(fault_class=v.fault_class.value, time=format_rfc3339(run.now))
        for v in counted
        if v.fault_class in windowed
    ]
    # A disruption is no crash loop: it never lengthens the backoff of the replacements after it.
    if any(v.fault_class != FaultClass.DISRUPTION for v in counted):
        _grow_backoff_series(run)
    run.restarts.pod_replacement += len(charged)
    run.counters["pod_replacements"] += len(charged)
    for verdict in charged:
        if verdict.action == FailureAction.IGNORE:
            run.event(
                events.NORMAL,
                events.FAULT_IGNORED,
                f"rule {verdict.rule} of failurePolicy.rules: {verdict.fault_class} of worker "
                f"{verdict.loss.index} counted against no budget",
            )


def _grow_backoff_series(run: PassState) -> None:
    """A fault after the job was Ready for backoffResetSeconds starts a new series."""
    reset = timedelta(seconds=run.job.model.spec.failure_policy.backoff_reset_seconds)
    ready = cond.find(run.conditions, cond.COND_READY)
    since = (
        parse_rfc3339(ready.last_transition_time)
        if ready is not None and ready.status == ConditionStatus.TRUE
        else None
    )
    if since is not None and run.now - since >= reset:
        run.budget.consecutive_faults = 0
    run.budget.consecutive_faults += 1


def _choose_scope(run: PassState, verdicts: list[Verdict]) -> None:
    actions = [
        DEFAULT_ACTIONS[v.fault_class] if v.action == FailureAction.IGNORE else v.action for v in verdicts
    ]
    why = None
    if not run.job.store_pod and _rendezvous_host_lost(verdicts):
        why = "worker 0 (the rendezvous host) was lost"
    elif FailureAction.RESTART_JOB in actions:
        why = _gang_restart_cause(run, verdicts)
    if why is None:
        for verdict in verdicts:
            run.entry(WORKER, verdict.loss.index).state = EntryState.REPLACING
            run.replaced_alone.add(verdict.loss.index)
        return
    run.counters["gang_restarts"] += 1
    drop_surges(run)  # every worker is recreated at once: no replacement takes a surge's node
    run.event(events.WARNING, events.GANG_RESTART, f"restarting all {run.job.nodes} workers: {why}")
    for index in range(run.job.nodes):
        run.entry(WORKER, index).state = EntryState.REPLACING
    if run.job.store_pod:
        _rebuild_world(run)


def _rendezvous_host_lost(verdicts: list[Verdict]) -> bool:
    """FtLauncher without a store pod: worker 0 hosts the rendezvous store; losing its pod (not its
    processes) loses it."""
    return any(
        v.loss.role == WORKER and v.loss.index == 0 and v.fault_class != FaultClass.PROCESS_FAILURE
        for v in verdicts
    )


def _gang_restart_cause(run: PassState, verdicts: list[Verdict]) -> str:
    if any(v.loss.role == STORE for v in verdicts):
        return "the store pod (the training world's stores) was lost"
    if any(v.rule is not None and v.action == FailureAction.RESTART_JOB for v in verdicts):
        return "a failurePolicy rule asks for it"
    if any(left_for_a_peers_drain(v.loss.pod) for v in verdicts):
        return "a worker's processes left after another pod's drain"
    return "a worker's processes failed"


def _rebuild_world(run: PassState) -> None:
    """With a store pod, a gang restart forms a new world from scratch. The store pod is recreated (a
    fresh store: under Supervisor pods that find the old world's marker in it stand by instead of
    starting ranks; under FtLauncher no old round of the rendezvous is left) and, where the spares
    take part in the training, so are they (Supervisor's reserve ranks belong to the broken world,
    FtLauncher's standby nodes to the old rendezvous); `placement` creates no pod until the old store
    is gone."""
    run.entry(*STORE_KEY).state = EntryState.REPLACING
    if not run.job.spares_in_training:
        return
    for index in range(run.job.hot_spares):
        pod = run.pod(SPARE, index)
        if pod is not None:
            run.remove_pod(pod)
            del run.pods[(SPARE, index)]
        run.entry(SPARE, index).reset()
        run.spares_taken.add(index)  # recreated on a later pass, once the name is free


def _fail_fatal(run: PassState, verdict: Verdict) -> None:
    """A FailJob verdict: a failurePolicy rule's, else the launcher's word that the command cannot start
    or fails at the same step on every try."""
    loss = verdict.loss
    if verdict.rule is None and repeated.launcher_stopped(loss.pod):
        _fail(
            run, events.DETERMINISTIC_FAILURE, repeated.launcher_message(loss.index, loss.pod, loss.message)
        )
        return
    if verdict.rule is None:
        _fail(
            run,
            events.STARTUP_FAILED,
            startup.launcher_message(loss.role, loss.index, loss.pod, loss.message),
        )
        return
    message = (
        f"rule {verdict.rule} of failurePolicy.rules (FailJob) matched a {verdict.fault_class}: "
        f"{loss.message}"
    )
    _fail(run, events.FAILED_BY_RULE, message)


def _fail_budget(run: PassState, used: str, verdicts: list[Verdict]) -> None:
    _fail(run, events.RESTART_BUDGET_EXHAUSTED, f"{used}; not replacing after: {verdicts[0].loss.message}")


def _fail(run: PassState, reason: str, message: str) -> None:
    """Failed, and in the same status write neither Ready nor Recovering: nothing runs any more."""
    run.condition(cond.COND_FAILED, True, reason, message)
    run.condition(cond.COND_READY, False, reason, "the job failed")
    run.condition(cond.COND_RECOVERING, False, reason, "the job failed")
    run.event(events.WARNING, reason, message)
    run.completion_time = run.completion_time or format_rfc3339(run.now)
    drop_surges(run)
    run.remove_all_pods()


def attribute_late_node_loss(run: PassState, entry: PodStatus, pod: PodState) -> None:
    """Record the node loss behind a worker (or the store pod) already being replaced for another fault.

    Worker 0's node dies (FtLauncher; the store pod's, under Supervisor); the other workers lose the
    rendezvous store and fail within seconds, long before the node is marked NotReady: the pass that
    sees their failure restarts the gang, and the old pod is still on its node, apparently healthy.
    Once the node is judged lost, the loss is recorded here (an Event, the node's fault, its exclusion
    when due, the node-loss metric) and the caller force-deletes the old pod. The budget was charged
    by the restart already.
    A node fault recorded since the pod was created (a NodeLost loss, or this) is not recorded again.
    """
    if entry.state != EntryState.REPLACING or not entry.node_name or pod.node_name != entry.node_name:
        return
    problem = run.problem(pod)
    if problem is None or pod.node_name in run.faulted_nodes or _fault_recorded_since(run, pod):
        return
    run.event(events.WARNING, events.NODE_LOST, f"{entry.role} pod {pod.name}: {problem.message}")
    record_node_fault(run, pod.node_name, problem)
    run.counters["node_losses"] += 1


def _fault_recorded_since(run: PassState, pod: PodState) -> bool:
    record = next((f for f in run.faults if f.node_name == pod.node_name), None)
    last = parse_rfc3339(record.last_time) if record is not None else None
    return last is not None and (pod.created is None or last >= pod.created)


def record_node_fault(run: PassState, node: str, problem: NodeProblem) -> None:
    """Count a fault on `node` (once per pass) and exclude the node when it is gone or a repeat offender."""
    if not node or node in run.faulted_nodes:
        return
    run.faulted_nodes.add(node)
    record = next((f for f in run.faults if f.node_name == node), None)
    if record is None:
        record = NodeFault(node_name=node)
        run.faults.append(record)
    record.count += 1
    record.last_reason = problem.reason
    record.last_time = format_rfc3339(run.now)
    if any(e.node_name == node for e in run.excluded):
        return
    threshold = run.job.policy.repeat_offender_threshold
    if problem.permanent or record.count >= threshold:
        _exclude(run, node, problem, record, threshold)


def _exclude(run: PassState, node: str, problem: NodeProblem, record: NodeFault, threshold: int) -> None:
    why = problem.reason if problem.permanent else "RepeatOffender"
    run.excluded.append(ExcludedNode(node_name=node, reason=why, time=format_rfc3339(run.now)))
    detail = problem.message if problem.permanent else f"{record.count} faults (threshold {threshold})"
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
