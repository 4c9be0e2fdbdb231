"""Lifecycle: a job running, suspended, resumed, finished (Succeeded or Failed), expired, deleted.

- `resume`: `spec.suspend` false again (or never set): the Suspended condition is cleared and the
  suspended entries are created again.
- `remove_surplus`: pods and entries beyond `spec.nodes` / `spec.hotSpares` go.
- `update_running_conditions`: Ready from the workers' counts, Recovering until training advances
  again after a fault (`decide.training`); Succeeded once every worker succeeded (the spares then go).
- `suspend`: every pod goes, the storage stays, entries read `Suspended` (surge pods and their
  entries go: `decide.surges`).
- `keep_finished`: a finished job keeps its succeeded pods (a failed one keeps none; no job keeps its
  spares and surge pods) and is deleted `ttlSecondsAfterFinished` after it finished.
- `reconcile_invalid`: a job whose spec does not validate only gets a condition and a Warning.
- `finalize`: what deleting a job does beyond garbage collection (storage under `Delete`, taints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from rtj_contract.times import format_rfc3339, parse_rfc3339

from rtj_operator import constants, events, render
from rtj_operator.api import EntryState
from rtj_operator.decide import conditions as cond
from rtj_operator.decide import milestones, training
from rtj_operator.decide.actions import Action, CreateObject, DeleteJob, DeleteObject, Event, TaintNode
from rtj_operator.decide.state import (
    SPARE,
    STORE,
    STORE_KEY,
    WORKER,
    PassState,
    drop_surges,
    entries_per_role,
)
from rtj_operator.observe import JobView

# The Ready condition names at most this many workers whose containers cannot start.
MAX_WAITING_LISTED = 3


def finished(run: PassState) -> bool:
    return cond.finished(run.conditions)


def resume(run: PassState) -> None:
    """The job is not suspended: clear a Suspended condition and want the suspended pods again."""
    if cond.condition_true(run.conditions, cond.COND_SUSPENDED):
        run.condition(cond.COND_SUSPENDED, False, events.RESUMED, "spec.suspend is false")
        run.event(events.NORMAL, events.RESUMED, "job resumed: recreating workers")
        for entry in run.entries.values():
            if entry.state == EntryState.SUSPENDED:
                entry.reset()
    elif not cond.condition_set(run.conditions, cond.COND_SUSPENDED):
        run.condition(cond.COND_SUSPENDED, False, cond.REASON_NOT_SUSPENDED, "spec.suspend is false")


def remove_surplus(run: PassState) -> None:
    """Pods and entries with an index beyond the spec (it shrank, or someone made them) go."""
    for pod in run.stray:
        run.remove_pod(pod)
    limits = entries_per_role(run.job)
    for key in [k for k in run.entries if k[1] >= limits.get(k[0], run.job.hot_spares)]:
        del run.entries[key]


def mark_started(run: PassState, first_start: bool) -> None:
    """The first pass that created pods sets startTime and says so."""
    if run.created_pods and first_start:
        run.start_time = format_rfc3339(run.now)
        created = milestones.children_created(run.job.nodes, run.job.hot_spares)
        run.event(created.type, created.reason, created.message)


def ensure_base(run: PassState) -> None:
    """The Service, storage and RBAC, asserted before the pods that need them (creates are idempotent)."""
    if (run.created_pods or run.observed.ensure_base) and not finished(run) and not run.holding:
        run.actions[:0] = [CreateObject(m) for m in render.render_base(run.job.model, uid=run.job.uid)]


def update_running_conditions(run: PassState) -> None:
    nodes = run.job.nodes
    ready, succeeded, _ = run.worker_counts()
    if succeeded == nodes:
        _succeed(run)
        return
    if ready + succeeded == nodes and ready > 0 and _store_running(run):
        run.condition(cond.COND_READY, True, cond.REASON_ALL_WORKERS_READY, f"{ready}/{nodes} workers ready")
        if cond.condition_true(run.conditions, cond.COND_RECOVERING):
            # Ready pods are not training: the recovery ends when the step advances (decide.training).
            if training.recovery_ended(run):
                training.end_recovery(run)
                return
            training.await_progress(run)
    else:
        run.condition(cond.COND_READY, False, cond.REASON_WORKERS_NOT_READY, _not_ready_message(run))
    if not cond.condition_set(run.conditions, cond.COND_RECOVERING):
        run.condition(cond.COND_RECOVERING, False, cond.REASON_NO_FAULT, "no fault is being recovered")


def _store_running(run: PassState) -> bool:
    """With a store pod, the world cannot form nor go on without its stores (Supervisor) or its
    rendezvous (FtLauncher), so the job is Ready only while the store pod runs too."""
    pod = run.pod(*STORE_KEY)
    return not run.job.store_pod or (
        pod is not None
        and pod.phase == "Running"
        and not pod.deleting
        and run.entry(*STORE_KEY).state == EntryState.RUNNING
    )


def _not_ready_message(run: PassState) -> str:
    """`r/n workers ready`, whether the store pod (Supervisor) is not running, and why a worker's (or the
    store's) container cannot start (ErrImagePull, ...) if one says."""
    ready, _, _ = run.worker_counts()
    keys = [(WORKER, i) for i in range(run.job.nodes)] + ([STORE_KEY] if run.job.store_pod else [])
    waiting = [
        f"{pod.name}: {pod.waiting}" for key in keys if (pod := run.pod(*key)) is not None and pod.waiting
    ]
    more = (
        [f"and {len(waiting) - MAX_WAITING_LISTED} more waiting"] if len(waiting) > MAX_WAITING_LISTED else []
    )
    store = [] if _store_running(run) else [f"store pod {run.job.pod_name(*STORE_KEY)} not running"]
    summary = [f"{ready}/{run.job.nodes} workers ready", *store]
    return "; ".join([*summary, *waiting[:MAX_WAITING_LISTED], *more])


def _succeed(run: PassState) -> None:
    nodes = run.job.nodes
    run.condition(cond.COND_SUCCEEDED, True, events.JOB_SUCCEEDED, f"all {nodes} workers succeeded")
    run.condition(cond.COND_READY, False, cond.REASON_FINISHED, "the job succeeded")
    run.condition(cond.COND_RECOVERING, False, cond.REASON_FINISHED, "the job succeeded")
    run.event(events.NORMAL, events.JOB_SUCCEEDED, f"all {nodes} workers succeeded")
    run.completion_time = run.completion_time or format_rfc3339(run.now)
    drop_surges(run)
    run.remove_all_pods(roles=(SPARE, STORE))


def suspend(run: PassState) -> None:
    if run.condition(cond.COND_SUSPENDED, True, events.SUSPENDED, "spec.suspend is true"):
        run.event(events.NORMAL, events.SUSPENDED, "job suspended: workers and spares deleted, storage kept")
    run.condition(cond.COND_READY, False, events.SUSPENDED, "the job is suspended")
    run.condition(cond.COND_RECOVERING, False, events.SUSPENDED, "the job is suspended")
    drop_surges(run)
    run.remove_all_pods()
    for entry in run.entries.values():
        entry.reset(EntryState.SUSPENDED)


def keep_finished(run: PassState) -> None:
    failed = cond.condition_true(run.conditions, cond.COND_FAILED)
    drop_surges(run)
    if failed:
        _not_ready_after_failure(run)
        run.remove_all_pods()
        for entry in run.entries.values():
            if (entry.role, entry.index) not in run.pods:
                entry.state = EntryState.FAILED if entry.role == WORKER else EntryState.CREATING
    else:
        run.remove_all_pods(roles=(SPARE, STORE))
    for key in [k for k in run.entries if k[0] == SPARE]:
        if key not in run.pods:
            del run.entries[key]
    store = run.entries.get(STORE_KEY)
    if store is not None and STORE_KEY not in run.pods:
        # Kept (status.store is merged, not replaced): the store pod is gone with the finished job.
        store.reset(EntryState.FAILED if failed else EntryState.SUCCEEDED)
    _expire(run)


def _not_ready_after_failure(run: PassState) -> None:
    """A failed job is not Ready (`failures` says so when it fails; a job failed by an operator that did
    not may still say Ready=True)."""
    if cond.condition_true(run.conditions, cond.COND_READY):
        failed = cond.find(run.conditions, cond.COND_FAILED)
        reason = failed.reason if failed is not None and failed.reason else cond.REASON_FINISHED
        run.condition(cond.COND_READY, False, reason, "the job failed")


def _expire(run: PassState) -> None:
    """ttlSecondsAfterFinished: delete the job once it has passed, else look again then."""
    ttl = run.job.ttl_seconds_after_finished
    if ttl is None:
        return
    expiry = (parse_rfc3339(run.completion_time) or run.now) + timedelta(seconds=ttl)
    if run.now >= expiry:
        run.actions.append(DeleteJob(run.job.name, run.job.namespace, run.job.uid))
        run.event(events.NORMAL, events.TTL_EXPIRED, f"deleting the job {ttl}s after it finished")
    else:
        run.at(expiry)


def reconcile_invalid(
    status: Mapping[str, Any], generation: int, message: str, now: datetime
) -> tuple[dict[str, Any], bool, tuple[Event, ...]]:
    """A job whose spec does not validate: Ready=False/InvalidSpec with the field-naming message.

    Returns (status, changed, events). The Warning is emitted only when the condition first flips (or
    its message changes) so that an invalid object does not flood the Events.
    """
    conditions = cond.read(status)
    before = cond.find(conditions, cond.COND_READY)
    unchanged = before is not None and before.reason == events.INVALID_SPEC and before.message == message
    cond.set_condition(
        conditions,
        cond.COND_READY,
        status=False,
        reason=events.INVALID_SPEC,
        message=message,
        now=now,
        generation=generation,
    )
    new = cond.rewritten(status, conditions)
    new["observedGeneration"] = generation
    emitted = () if unchanged else (Event(events.WARNING, events.INVALID_SPEC, message),)
    return new, comparable(new) != comparable(status), emitted


def finalize(job: JobView, nodes: Mapping[str, Sequence[tuple[str, str, str]]]) -> tuple[Action, ...]:
    """What deleting a job does beyond ownerReference garbage collection.

    Children with ownerReferences go with the job. The checkpoint volume never carries one under
    `retentionPolicy: Retain`, so it survives; under `Delete` the claim (and a static volume) is
    deleted here. Taints this job put on excluded nodes are removed. `nodes` maps node name to its
    taints as (key, value, effect).
    """
    actions: list[Action] = []
    if job.retention_delete:
        for manifest in render.render_storage(job.model, uid=job.uid):
            kind = str(manifest.get("kind"))
            metadata = manifest.get("metadata", {})
            namespace = metadata.get("namespace") if kind == "PersistentVolumeClaim" else None
            actions.append(DeleteObject(str(manifest.get("apiVersion")), kind, metadata["name"], namespace))
    for node, taints in sorted(nodes.items()):
        for key, value, effect in taints:
            if key == constants.TAINT_EXCLUDED and value == job.name:
                actions.append(TaintNode(node, key, value, effect, remove=True))
    return tuple(actions)


def comparable(status: Mapping[str, Any]) -> dict[str, Any]:
    """Status without empty values, so that {} and absent compare equal (the API server prunes them)."""

    def clean(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(v) for k, v in value.items() if v not in (None, [], {})}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    result: dict[str, Any] = clean(status)
    return result
