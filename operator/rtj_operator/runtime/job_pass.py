"""Carrying out a pass over one job: observe, decide, write status, then act.

`queue` calls `run_pass(ctx, key, runner)`. It decides from kopf's indexes first (cheap, and for an
idle job the end of the pass); only when something is to be done does it read the job and its pods
fresh and decide again, so that no fault is counted twice and no pod is created twice. Then it
writes status (optimistically, with the resourceVersion read), applies the actions and posts the
Events; a create the API server refuses for good ends the actions and becomes a condition, but for
an optional one (a surge pod), whose entry only leaves status.
`finalize_job` is the same for a deleted job (the finalizer's work).

With leader election, a replica that no longer leads writes nothing more: every status write and
every action first checks `OperatorContext.acting` (fencing; see `runtime.leader`). The children
other than pods (Service, storage, RBAC) are asserted once: a create that succeeded or found the
child existing is remembered for the job (`known_child`), and later passes skip that create until
`KNOWN_CHILD_SECONDS` have passed (a child someone deleted is then created again).

Milestone Events (`decide.milestones`: the job's children created, succeeded, budget exhausted) are
posted under names of their own, and the first pass of each job after the operator starts posts
again those its status says are due: one lost to a crash between the status write and the post
appears then, one already posted is answered AlreadyExists.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from rtj_operator import constants, decide, events, metrics, nodehealth, observe
from rtj_operator.decide import milestones
from rtj_operator.fsx_policy import FsxAllowList
from rtj_operator.runtime import kube
from rtj_operator.runtime.context import OperatorContext
from rtj_operator.runtime.queue import DEBOUNCE_SECONDS, JobKey, JobRunner, WorkQueue
from rtj_operator.validation import JobValidationError

logger = logging.getLogger(__name__)

# What a decision was made from: the plan, the job as seen, and the body it was read from.
Decided = tuple[decide.Plan, observe.JobView, dict[str, Any]]

# How long a child (not a pod) created or found existing is trusted to exist without a new create.
KNOWN_CHILD_SECONDS = 600.0
# Pod creates (or deletes) of one pass in flight at once.
APPLY_CONCURRENCY = 8


class NotLeadingError(Exception):
    """This replica lost the Lease: it must not write (another replica may be acting)."""


def ensure_acting(ctx: OperatorContext) -> None:
    if not ctx.acting():
        raise NotLeadingError("not the leader: nothing written")


def new_context(
    client: kube.Kube,
    *,
    metrics_port: int | None = None,
    node_health: nodehealth.NodeHealth | None = None,
    fsx_allowed: FsxAllowList | None = None,
) -> OperatorContext:
    """An operator's state, its work queue running `run_pass`."""
    ctx = OperatorContext(
        kube=client,
        metrics_port=metrics_port,
        node_health=node_health or nodehealth.NodeHealth(),
        fsx_allowed=fsx_allowed or FsxAllowList(),
    )
    ctx.queue = WorkQueue(functools.partial(run_pass, ctx))
    return ctx


def _now() -> datetime:
    return datetime.now(UTC)


async def run_pass(ctx: OperatorContext, key: JobKey, runner: JobRunner) -> str:
    """One pass over one job; returns the result label for metrics."""
    try:
        ensure_acting(ctx)
        return await _run_pass(ctx, key, runner)
    except NotLeadingError:
        return "fenced"


async def _run_pass(ctx: OperatorContext, key: JobKey, runner: JobRunner) -> str:
    body = ctx.job_body(key)
    if body is None:
        forget(ctx, key)
        return "gone"
    if body.get("metadata", {}).get("deletionTimestamp"):
        return "deleting"  # the finalizer handler (on.delete) does the rest
    ensure_base = runner.ensure_base
    decided = await _decide(ctx, key, runner, body, ensure_base=ensure_base)
    if isinstance(decided, str):
        return decided
    plan, view, body = decided
    log_decision(body, plan)
    status = plan.status.to_status()
    if plan.status_changed:
        written = await write_status(ctx, body, status, runner)
        if written is None:
            return "conflict"
        body = written
    runner.offsets = dict(plan.offsets)
    if ensure_base:
        runner.ensure_base = False
    refused, optional = await _apply(ctx, key, runner, plan.actions)
    count_writes(ctx)
    ensure_acting(ctx)
    body = await _surges_refused(ctx, runner, body, optional)
    for event in plan.events:
        # After a refusal, "created" is not what happened: the Blocked Warning says what did.
        if refused is None or event.reason != events.CHILDREN_CREATED:
            await _post(ctx, runner, body, event)
    if not runner.milestones_replayed:
        runner.milestones_replayed = True
        for event in milestones.reached(view.status, view.nodes, view.hot_spares):
            await _post(ctx, runner, body, event)
    if refused is not None:
        return await _refused(ctx, runner, body, view.generation, refused)
    metrics.observe_pass(
        key[0],
        key[1],
        state=plan.status.state,
        counters=plan.counters,
        old_restarts=view.status.get("restarts") or {},
        new_restarts=status.get("restarts") or {},
        goodput_percent=plan.status.progress.goodput_percent if plan.status.progress is not None else None,
        status=plan.status,
        failures_allowed=view.policy.max_node_replacements,
    )
    if plan.requeue_after is not None:
        await ctx.queue.trigger(key, delay=plan.requeue_after)
    return "acted" if plan.actions or plan.status_changed else "idle"


def log_decision(body: Mapping[str, Any], plan: decide.Plan) -> None:
    """One line for a pass that posts Events (a fault counted, a pod replaced, a state reached): what
    it decided, and from which version of the job, so that a recovery can be followed in the
    operator's log as well as in the Events (which the API server keeps for an hour)."""
    if not plan.events:
        return
    metadata = body.get("metadata", {})
    logger.info(
        "%s/%s: from resourceVersion %s: %s; %d action(s)",
        metadata.get("namespace"),
        metadata.get("name"),
        metadata.get("resourceVersion"),
        "; ".join(f"{event.reason}: {event.message}" for event in plan.events),
        len(plan.actions),
    )


async def _apply(
    ctx: OperatorContext, key: JobKey, runner: JobRunner, actions: Sequence[decide.Action]
) -> tuple[decide.Refusal | None, list[decide.Refusal]]:
    """Apply the actions in order, a run of pod creates (or of pod deletes) side by side; stop at a
    create the API server refuses for good and return it (the first in order), with the optional
    creates it refused before (surge pods: the job does without them)."""
    optional: list[decide.Refusal] = []
    for batch in _batches(actions):
        due = [action for action in batch if not _known_recently(runner, action)]
        if not due:
            continue  # children created or found existing a moment ago: no request
        ensure_acting(ctx)
        errors = await _apply_side_by_side(ctx, key[0], due)
        for action, error in zip(due, errors, strict=True):
            if isinstance(error, kube.RefusedError) and isinstance(action, decide.CreateObject):
                if action.optional:
                    optional.append(error.refusal)
                    continue
                return error.refusal, optional
            if error is not None:
                raise error
            child = known_child(action)
            if child is not None:
                runner.known_children[child] = time.monotonic()
    return None, optional


async def _surges_refused(
    ctx: OperatorContext, runner: JobRunner, body: dict[str, Any], refusals: Sequence[decide.Refusal]
) -> dict[str, Any]:
    """Surge pods the API server refused (a quota with no room for one more pod): their entries leave
    status, so that no pass asks again, and a Warning says why (`decide.surge_refused`); nothing is
    blocked. The job as written (on a conflict, as it was: the next pass asks once more)."""
    status: dict[str, Any] = dict(body.get("status") or {})
    emitted: list[decide.Event] = []
    for refusal in refusals:
        logger.info("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], refusal.describe())
        status, _, found = decide.surge_refused(status, refusal.name, refusal.describe())
        emitted += found
    if not emitted:
        return body
    written = await write_status(ctx, body, status, runner)
    if written is None:
        return body
    for event in emitted:
        post_event(written, event)
    return written


def _side_by_side_kind(action: decide.Action) -> str | None:
    """The kind of a run of actions that may go to the API server at once: pods of one job are
    independent of each other (a 1,000-node job's creates one after another took a minute)."""
    if isinstance(action, decide.DeletePod):
        return "delete-pod"
    if isinstance(action, decide.CreateObject) and action.manifest.get("kind") == "Pod":
        return "create-pod"
    return None


def _batches(actions: Sequence[decide.Action]) -> list[list[decide.Action]]:
    """The actions in order, consecutive ones of one side-by-side kind together, every other alone."""
    batches: list[list[decide.Action]] = []
    for action in actions:
        kind = _side_by_side_kind(action)
        if kind is not None and batches and _side_by_side_kind(batches[-1][0]) == kind:
            batches[-1].append(action)
        else:
            batches.append([action])
    return batches


def _known_recently(runner: JobRunner, action: decide.Action) -> bool:
    child = known_child(action)
    return (
        child is not None and time.monotonic() - runner.known_children.get(child, -1e18) < KNOWN_CHILD_SECONDS
    )


async def _apply_side_by_side(
    ctx: OperatorContext, namespace: str, actions: Sequence[decide.Action]
) -> list[BaseException | None]:
    """Each action's error (None: applied), at most `APPLY_CONCURRENCY` requests in flight."""
    slots = asyncio.Semaphore(APPLY_CONCURRENCY)

    async def one(action: decide.Action) -> BaseException | None:
        async with slots:
            try:
                await asyncio.to_thread(ctx.kube.apply, action, namespace)
            except Exception as error:  # reported in order by the caller
                return error
            return None

    return list(await asyncio.gather(*(one(action) for action in actions)))


def known_child(action: decide.Action) -> tuple[str, str, str, str] | None:
    """The key under which a create of a child other than a pod is remembered, else None."""
    if not isinstance(action, decide.CreateObject) or action.manifest.get("kind") == "Pod":
        return None
    metadata = action.manifest.get("metadata") or {}
    owners = metadata.get("ownerReferences") or [{}]
    return (
        str(action.manifest.get("kind")),
        str(metadata.get("namespace") or ""),
        str(metadata.get("name")),
        str(owners[0].get("uid") or ""),
    )


async def _refused(
    ctx: OperatorContext, runner: JobRunner, body: Mapping[str, Any], generation: int, refusal: decide.Refusal
) -> str:
    """A child refused for good: Blocked=True with the server's message, a Warning, and a slow recheck."""
    runner.refused_at = _now()
    logger.warning("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], refusal.describe())
    status, changed, emitted = decide.record_refusal(
        dict(body.get("status") or {}), generation, refusal, runner.refused_at
    )
    if changed and await write_status(ctx, body, status, runner) is None:
        return "conflict"
    for event in emitted:
        post_event(body, event)
    key = (str(body["metadata"]["namespace"]), str(body["metadata"]["name"]))
    await ctx.queue.trigger(key, delay=decide.REFUSAL_RECHECK_SECONDS)
    return "refused"


async def _decide(
    ctx: OperatorContext, key: JobKey, runner: JobRunner, body: dict[str, Any], *, ensure_base: bool
) -> Decided | str:
    """Decide from the indexes; when something is to be done, decide again from fresh reads."""
    try:
        view = observe.observe_job(body)
    except JobValidationError:
        fresh = await asyncio.to_thread(ctx.kube.get_job, *key)
        return "gone" if fresh is None else await _invalid(ctx, fresh)
    if runner.last_status is not None and overwritten(runner, body):
        # Someone else wrote the status, or the index lags our last write: read it fresh.
        return await _decide_fresh(ctx, key, runner, ensure_base=ensure_base)
    observed = _observe(ctx, key, runner, ctx.job_pods(key), ctx.all_nodes(), ensure_base=ensure_base)
    plan = decide.reconcile(view, observed, _now())
    if not plan.actions and not plan.status_changed:
        return plan, view, body
    # Something is to be done: the indexes may lag our own writes.
    return await _decide_fresh(ctx, key, runner, ensure_base=ensure_base)


def _observe(  # noqa: PLR0913 - the pass's parts, then the observations
    ctx: OperatorContext,
    key: JobKey,
    runner: JobRunner,
    pods: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    *,
    ensure_base: bool,
) -> observe.Observed:
    """What the operator sees of one job: its pods and the nodes, with what the runner and the
    operator's settings know (restart offsets, the last refusal, health signals, FSx allow-list,
    the trainers' progress reports)."""
    return observe.observe(
        pods,
        nodes,
        ensure_base=ensure_base,
        offsets=runner.offsets,
        refused_at=runner.refused_at,
        health=ctx.node_health,
        fsx_allowed=ctx.fsx_allowed,
        reports=ctx.progress.reports(key),
    )


async def _decide_fresh(
    ctx: OperatorContext, key: JobKey, runner: JobRunner, *, ensure_base: bool
) -> Decided | str:
    fresh = await asyncio.to_thread(ctx.kube.get_job, *key)
    if fresh is None or fresh.get("metadata", {}).get("deletionTimestamp"):
        return "gone"
    foreign = runner.last_status is not None and overwritten(runner, fresh)
    if foreign:
        _restore_own_status(fresh, runner)
    try:
        view = observe.observe_job(fresh)
    except JobValidationError:
        return await _invalid(ctx, fresh)
    pods = await asyncio.to_thread(ctx.kube.list_pods, *key)
    nodes = await _nodes_confirmed(ctx, pods, view.status)
    observed = _observe(ctx, key, runner, pods, nodes, ensure_base=ensure_base)
    plan = decide.reconcile(view, observed, _now())
    if foreign:
        plan = dataclasses.replace(plan, status_changed=True)  # the stored status must be rewritten
    return plan, view, fresh


def overwritten(runner: JobRunner, body: Mapping[str, Any]) -> bool:
    """Whether the job's status differs from what this operator last wrote (None: nothing written yet).

    A status that is what the newest write, whose answer was lost, would have stored is this
    operator's own: it becomes the one last written. (Taken for someone else's, it would be replaced
    by the status before that write, and the faults the write counted counted again.)"""
    if runner.last_status is None:
        return False
    stored = dict(body.get("status") or {})
    theirs = decide.comparable(stored)
    if theirs == decide.comparable(runner.last_status):
        return False
    if runner.sent_status is not None and theirs == decide.comparable(runner.sent_status):
        runner.last_status, runner.sent_status = copy.deepcopy(stored), None
        return False
    return True


def _restore_own_status(fresh: dict[str, Any], runner: JobRunner) -> None:
    """Status is the operator's record: one written by anyone else is replaced by the operator's own,
    which the pass then decides from and writes back (Event StatusOverwritten)."""
    theirs = dict(fresh.get("status") or {})
    own = copy.deepcopy(runner.last_status or {})
    message = (
        f"status was written by someone else (state {theirs.get('state') or 'unset'}); "
        f"restored the operator's (state {own.get('state') or 'unset'})"
    )
    logger.warning("%s/%s: %s", fresh["metadata"]["namespace"], fresh["metadata"]["name"], message)
    post_event(fresh, decide.Event(events.WARNING, events.STATUS_OVERWRITTEN, message))
    fresh["status"] = own


async def _nodes_confirmed(
    ctx: OperatorContext, pods: list[dict[str, Any]], status: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The indexed nodes, plus any node a pod or status refers to that the index does not know yet.

    A node missing from the index reads as deleted, which excludes it for good; the node watch can
    lag the pod watch (a pod bound to a node added a moment ago), so absence is confirmed by a read.
    """
    nodes = ctx.all_nodes()
    known = {n.get("metadata", {}).get("name") for n in nodes}
    referenced = {p.get("spec", {}).get("nodeName") for p in pods}
    referenced |= {
        e.get("nodeName") for e in (status.get("workers") or {}).get("pods") or [] if isinstance(e, dict)
    }
    store = status.get("store")
    if isinstance(store, Mapping):
        referenced.add(store.get("nodeName"))
    for name in sorted(n for n in referenced if n and n not in known):
        node = await asyncio.to_thread(ctx.kube.get_node, name)
        if node is not None:
            nodes.append(node)
    return nodes


async def write_status(
    ctx: OperatorContext, body: Mapping[str, Any], status: dict[str, Any], runner: JobRunner | None
) -> dict[str, Any] | None:
    """Write status with the resourceVersion read; the job as written, or None (and a new pass soon)
    on a conflict. The stored status is remembered as the operator's own (`own_status`)."""
    metadata = body.get("metadata", {})
    namespace, name = metadata["namespace"], metadata["name"]
    ensure_acting(ctx)
    if runner is not None:
        runner.sent_status = kube.merged(dict(body.get("status") or {}), status)
    try:
        written = await asyncio.to_thread(
            ctx.kube.patch_status, namespace, name, status, metadata.get("resourceVersion")
        )
    except kube.ConflictError:
        # Someone (kopf's own annotations, a spec edit) wrote the job since it was read: decide
        # again from the newer version; nothing was done on the stale decision.
        await ctx.queue.trigger((namespace, name), delay=DEBOUNCE_SECONDS)
        return None
    if runner is not None:
        runner.last_status, runner.sent_status = copy.deepcopy(dict(written.get("status") or {})), None
    return written


async def _invalid(ctx: OperatorContext, body: Mapping[str, Any]) -> str:
    """A job that does not validate: say so in a condition and a Warning, and touch nothing else."""
    metadata = body.get("metadata", {})
    try:
        observe.observe_job(body)
    except JobValidationError as error:
        message = str(error)
    else:
        return "valid"
    generation = metadata.get("generation")
    status, changed, emitted = decide.reconcile_invalid(
        dict(body.get("status") or {}), generation if isinstance(generation, int) else 0, message, _now()
    )
    runner = ctx.queue.runners.get((str(metadata["namespace"]), str(metadata["name"])))
    if changed and await write_status(ctx, body, status, runner) is None:
        return "conflict"
    for event in emitted:
        post_event(body, event)
    metrics.observe_pass(
        metadata["namespace"],
        metadata["name"],
        state=status.get("state"),
        counters={},
        old_restarts={},
        new_restarts={},
        goodput_percent=None,
    )
    return "invalid"


async def finalize_job(ctx: OperatorContext, key: JobKey, body: kopf.Body) -> None:
    """A deleted job: delete what garbage collection does not (storage under Delete, taints)."""
    try:
        view = observe.observe_job(plain(body))
    except JobValidationError:
        forget(ctx, key)
        return  # nothing was ever created for an invalid job
    taints = {
        node["metadata"]["name"]: [
            (str(t.get("key")), str(t.get("value", "")), str(t.get("effect")))
            for t in node.get("spec", {}).get("taints") or []
        ]
        for node in ctx.all_nodes()
    }
    for action in decide.finalize(view, taints):
        if not ctx.acting():
            raise kopf.TemporaryError("not the leader: the finalizer is left to the leader", delay=5)
        await asyncio.to_thread(ctx.kube.apply, action, key[0])
        if isinstance(action, decide.DeleteObject):
            kopf.event(
                body,
                type=events.NORMAL,
                reason=events.STORAGE_DELETED,
                message=f"{action.kind} {action.name} deleted (retentionPolicy: Delete)",
            )
    count_writes(ctx)
    forget(ctx, key)


def count_writes(ctx: OperatorContext) -> None:
    for verb, count in ctx.kube.take_writes().items():
        metrics.WRITES.labels(verb=verb).inc(count)


def forget(ctx: OperatorContext, key: JobKey) -> None:
    ctx.queue.forget(key)
    metrics.forget_job(*key)


async def _post(
    ctx: OperatorContext, runner: JobRunner, body: Mapping[str, Any], event: decide.Event
) -> None:
    """Post an Event of the pass: a milestone under its own name (once per job), any other by kopf."""
    if event.reason not in milestones.MILESTONES:
        post_event(body, event)
        return
    ensure_acting(ctx)
    try:
        await asyncio.to_thread(ctx.kube.create, milestone_event(body, event))
    except Exception as error:  # an Event must not fail the pass: the next pass posts it again
        logger.warning("posting %s failed: %r", event.reason, error)
        runner.milestones_replayed = False


def milestone_event(body: Mapping[str, Any], event: decide.Event) -> dict[str, Any]:
    """The core/v1 Event of a milestone, named after the job's uid and the reason."""
    metadata = body["metadata"]
    now = _now().strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": milestones.event_name(metadata["name"], metadata["uid"], event.reason),
            "namespace": metadata["namespace"],
        },
        "involvedObject": {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:1024],
        "source": {"component": constants.MANAGED_BY},
        "reportingComponent": constants.MANAGED_BY,
        "reportingInstance": constants.MANAGED_BY,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_event(body: Mapping[str, Any], event: decide.Event) -> None:
    """Post an Event on the job (kopf.event reads apiVersion, kind and metadata of a Body)."""
    kopf.event(
        kopf.Body(cast(kopf.RawBody, dict(body))), type=event.type, reason=event.reason, message=event.message
    )


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A kopf Body (a view kopf may re-point at newer versions) as a plain dict of its own."""
    copied: dict[str, Any] = copy.deepcopy(dict(body))
    return copied
