"""Placement and spares: drive each worker and spare entry toward a running pod on a fit node.

- A `Replacing` worker: its old pod goes (once the backoff has passed since the newest replacement
  pod was created: `failurePolicy.backoffSeconds`, doubled per consecutive fault up to
  `maxBackoffSeconds`), then a replacement is created, on the node of its surge pod when that runs
  there (`decide.surges`: asked for while the old pod checkpointed), else on a ready hot spare's node
  when there is one (the surge pod or spare is given up, and the worker pinned there by node
  affinity), else wherever the scheduler puts it.
- A `Creating` worker: created (pinned, if its entry names a spare's node that is still usable); a
  spare that took the node it waits for gives way; a pod that landed on a dead node or waits for a
  pin that can no longer be honoured is created again (unpinned once the old pod is gone).
- A spare: created wherever it fits (off excluded nodes and nodes replacements are pinned to, but
  not off nodes that are merely NotReady: its affinity would outlive their recovery), replaced when
  its node fails, is excluded or the pod ends.
- Under `faultTolerance.launcher` Supervisor: the store pod first (`run_store`), recreated once its
  old pod is gone when a gang restart asked for a new one; no worker or spare is created while the
  old store still stands (`store_allows_pods`), so every pod of a new world meets a fresh store. A
  spare's pod runs reserve ranks of the world, so a replacement never takes a spare's node: it is
  placed by the scheduler and stands by.

Every pod is rendered whole by `rtj_operator.render` (a replacement's annotations included) and kept
off the job's excluded nodes and the nodes that are not Ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from rtj_operator import events, render
from rtj_operator.api import EntryState, PodStatus
from rtj_operator.decide import failures, surges
from rtj_operator.decide.actions import CreateObject
from rtj_operator.decide.state import (
    SPARE,
    STORE_KEY,
    SURGE,
    WORKER,
    PassState,
    discard_pod,
    pinned_nodes,
    spares_to_take,
)
from rtj_operator.observe import PodState


def run_workers(run: PassState) -> None:
    # Node losses found behind workers already being replaced are recorded before any pod is created,
    # so every pod created in this pass is kept off a node excluded in it.
    for index in range(run.job.nodes):
        pod = run.pod(WORKER, index)
        if pod is not None:
            failures.attribute_late_node_loss(run, run.entry(WORKER, index), pod)
    for index in range(run.job.nodes):
        run_worker(run, index)


def run_spares(run: PassState) -> None:
    for index in range(run.job.hot_spares):
        run_spare(run, index)


def run_store(run: PassState) -> None:
    """A job with a store pod: drive it toward running; a `Replacing` store's old pod goes first."""
    if not run.job.store_pod:
        return
    entry, pod = run.entry(*STORE_KEY), run.pod(*STORE_KEY)
    if entry.state == EntryState.REPLACING:
        if pod is not None:
            failures.attribute_late_node_loss(run, entry, pod)
            run.remove_pod(pod)
            return
        entry.reset()
        create_store(run)
        return
    if entry.state == EntryState.CREATING:
        if pod is None:
            create_store(run)
            return
        if run.problem(pod) is not None:
            # Never seen running (not counted): removed, and created again on a later pass.
            run.remove_pod(pod)
            return
    sync_entry_from_pod(entry, pod)


def create_store(run: PassState) -> None:
    manifest = render.render_store_pod(run.job.model, uid=run.job.uid, excluded_nodes=run.excluded_names())
    run.actions.append(CreateObject(manifest))
    run.created_pods = True


def store_allows_pods(run: PassState) -> bool:
    """Whether workers and spares may be created (with a store pod): not while a gang restart waits for
    the old store pod to go, nor while a store pod terminates (a suspended job's, resumed at once),
    lest they meet an old world's store."""
    if not run.job.store_pod:
        return True
    pod = run.pod(*STORE_KEY)
    return run.entry(*STORE_KEY).state != EntryState.REPLACING and not (pod is not None and pod.deleting)


def run_worker(run: PassState, index: int) -> None:
    """Drive one worker's entry toward a running pod."""
    entry = run.entry(WORKER, index)
    pod = run.pod(WORKER, index)
    if entry.state == EntryState.REPLACING:
        _drive_replacing(run, entry, pod)
    elif entry.state == EntryState.CREATING:
        _drive_creating(run, entry, pod)
    else:
        sync_entry_from_pod(entry, pod)


def _drive_replacing(run: PassState, entry: PodStatus, pod: PodState | None) -> None:
    """A counted fault: remove the old pod, then (after the backoff) create the replacement."""
    until = backoff_until(run)
    if pod is not None:
        # The old pod is kept (even stranded on a dead node) until the backoff has passed: its
        # creation time is what the backoff is measured from.
        if until is not None:
            run.at(until)
        else:
            run.remove_pod(pod)
        return
    if until is not None:
        run.at(until)
        return
    if not store_allows_pods(run):
        return  # the old store pod's deletion wakes the next pass
    replaced_node = entry.node_name
    excluded = run.excluded_names()
    node = surges.take_surge(run, entry.index, excluded) or take_spare(run, entry.index, excluded)
    entry.state, entry.node_name = EntryState.CREATING, node or ""
    where = f"on node {node}" if node else "by the scheduler"
    run.event(
        events.NORMAL, events.WORKER_REPLACED, f"worker {entry.index} replacement created, placed {where}"
    )
    replacement = render.Replacement(run.restarts.pod_replacement, replaced_node)
    create_worker(run, entry.index, node, replacement)


def _drive_creating(run: PassState, entry: PodStatus, pod: PodState | None) -> None:
    """A wanted pod: create it, or replace one that cannot start where it was put."""
    if pod is None:
        if not store_allows_pods(run):
            return
        pinned = entry.node_name
        if pinned and stale_pin(run, entry.index, pinned):
            pinned = entry.node_name = ""
        if pinned:
            release_spare_on(run, pinned)
        after_fault = run.restarts.pod_replacement > 0 and run.start_time is not None
        replacement = render.Replacement(run.restarts.pod_replacement) if after_fault else None
        create_worker(run, entry.index, pinned or None, replacement)
        return
    if run.problem(pod) is not None:
        # Not yet counted (never seen running): remove it and create it again elsewhere.
        run.remove_pod(pod)
        return
    if not pod.node_name and entry.node_name and not pod.deleting:
        if stale_pin(run, entry.index, entry.node_name):
            # The scheduler would wait forever. Not yet started, so it is created again; the pin is
            # dropped once this pod is gone, so that an operator stopped in between loses nothing.
            run.delete_pod(pod, force=True)
            return
        release_spare_on(run, entry.node_name)
    sync_entry_from_pod(entry, pod)


def sync_entry_from_pod(entry: PodStatus, pod: PodState | None) -> None:
    """Record what is observed of a pod that is not being replaced."""
    if pod is None or pod.deleting:
        return
    if pod.phase == "Succeeded":
        entry.state, entry.node_name = EntryState.SUCCEEDED, pod.node_name or entry.node_name
    elif pod.node_name:
        entry.state = EntryState.RUNNING if pod.phase == "Running" else EntryState.PENDING
        entry.node_name = pod.node_name
    elif entry.state != EntryState.CREATING:
        entry.state = EntryState.PENDING


def create_worker(
    run: PassState, index: int, node_name: str | None, replacement: render.Replacement | None
) -> None:
    excluded = run.excluded_names()
    if not node_name:
        # Keep unpinned workers off the nodes that replacements are pinned to (spares' and surges' nodes).
        excluded = sorted(set(excluded) | pinned_nodes(run, except_index=index))
    manifest = render.render_worker_pod(
        run.job.model,
        index,
        uid=run.job.uid,
        excluded_nodes=excluded,
        node_name=node_name or None,
        replacement=replacement,
    )
    run.actions.append(CreateObject(manifest))
    run.created_pods = True


def backoff_delay(run: PassState) -> timedelta:
    """backoffSeconds, doubled per consecutive fault after the second, capped at maxBackoffSeconds."""
    policy = run.job.model.spec.failure_policy
    doublings = max(run.budget.consecutive_faults - 2, 0)
    seconds = policy.backoff_seconds * 2 ** min(doublings, 32)
    return timedelta(seconds=min(seconds, max(policy.max_backoff_seconds, policy.backoff_seconds)))


def backoff_until(run: PassState) -> datetime | None:
    """Replacements are spaced by the backoff (`backoff_delay`) from the newest pod created after a fault."""
    delay = backoff_delay(run)
    newest = max(
        (
            p.created
            for p in run.pods.values()
            if p.role == WORKER
            and p.restart_count_annotation is not None
            # pods created for the restart in progress (a gang) do not hold back their siblings
            and p.restart_count_annotation < run.restarts.pod_replacement
            and p.created
        ),
        default=None,
    )
    if newest is None or delay <= timedelta(0):
        return None
    until = newest + delay
    return until if until > run.now else None


def take_spare(run: PassState, index: int, excluded: Sequence[str]) -> str | None:
    """Give up a ready spare outside the training for worker `index`'s replacement
    (`state.spares_to_take`); returns its node (Event `SpareUsed`)."""
    found = spares_to_take(run, excluded)
    if not found:
        return None
    k, pod = found[0]
    # Graceful: the replacement is pinned to the node by required affinity, so the scheduler
    # waits until the spare has released the node's GPUs rather than racing kubelet admission.
    _give_up_spare(run, k, pod)
    run.event(events.NORMAL, events.SPARE_USED, f"worker {index} replaced on hot spare node {pod.node_name}")
    return pod.node_name


def release_spare_on(run: PassState, node: str) -> None:
    """Make sure no spare (nor surge pod) still holds `node`, which a replacement worker is pinned to.

    Normally the spare (or surge pod) was deleted in the pass that pinned the worker; this covers an
    operator that stopped between writing that decision and deleting it, and a spare created before
    the pin (its affinity does not keep it off the node) that took the node meanwhile.
    """
    for k in range(run.job.hot_spares):
        pod = run.pod(SPARE, k)
        if pod is not None and pod.node_name == node and not pod.deleting:
            _give_up_spare(run, k, pod)
    for key, pod in sorted(run.pods.items()):
        if key[0] == SURGE and pod.node_name == node and not pod.deleting:
            discard_pod(run, key)  # `surges` wants it again, elsewhere, if still due


def _give_up_spare(run: PassState, index: int, pod: PodState) -> None:
    run.delete_pod(pod, force=False)
    run.entry(SPARE, index).reset()
    del run.pods[(SPARE, index)]
    # Its successor is created on a later pass, once the name is free again.
    run.spares_taken.add(index)


def stale_pin(run: PassState, index: int, node: str) -> bool:
    """A pin that can no longer be honoured: the node is gone, excluded, unfit or taken by another
    worker (or the store pod). A spare or surge pod on it is no obstacle: it gives way
    (`release_spare_on`)."""
    if node not in run.observed.nodes or node in run.excluded_names():
        return True
    return any(
        pod.node_name == node
        and not pod.deleting
        and role not in (SPARE, SURGE)
        and not (role == WORKER and other == index)
        for (role, other), pod in run.pods.items()
    )


def run_spare(run: PassState, index: int) -> None:
    """Drive one spare's entry toward a ready pod holding a fit node."""
    entry = run.entry(SPARE, index)
    pod = run.pod(SPARE, index)
    if index in run.spares_taken:
        return
    if pod is None:
        entry.reset()
        if not store_allows_pods(run):
            return
        # Keep new spares off the nodes that replacement workers are pinned to (a spare's old node).
        excluded = sorted(set(run.excluded_names(not_ready=False)) | pinned_nodes(run))
        manifest = render.render_spare_pod(run.job.model, index, uid=run.job.uid, excluded_nodes=excluded)
        run.actions.append(CreateObject(manifest))
        run.created_pods = True
        return
    problem = run.problem(pod)
    if problem is not None:
        if entry.on_node and entry.node_name == pod.node_name:
            failures.record_node_fault(run, pod.node_name, problem)
            run.event(events.WARNING, events.NODE_LOST, f"spare pod {pod.name}: {problem.message}")
        entry.reset()
        run.remove_pod(pod)
        return
    if pod.phase == "Succeeded" and run.job.spares_in_training and not pod.disruption:
        # It took part in the training (reserve ranks or a standby node, or active ones that took
        # over a lost rank's place) and the training finished: kept, as a worker that succeeded is.
        sync_entry_from_pod(entry, pod)
        return
    if pod.phase in {"Failed", "Succeeded"} or pod.disruption or on_excluded_node(run, pod):
        entry.reset()
        run.delete_pod(pod, force=False)
        return
    sync_entry_from_pod(entry, pod)


def on_excluded_node(run: PassState, pod: PodState) -> bool:
    """Whether the pod is bound to a node the job excluded: a spare there is never given up for a
    replacement (`take_spare`), so it is moved. One is left there when the pass that excluded its lost
    node stopped before deleting it and the node recovered, or when it was created before the
    exclusion and bound to the node later."""
    return bool(pod.node_name) and pod.node_name in run.excluded_names(not_ready=False)
