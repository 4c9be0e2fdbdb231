"""Carrying out a pass over one job: observe, decide, write status, then act.

`queue` calls `run_pass(ctx, key, runner)`. It decides from kopf's indexes first (cheap, and for an
idle job the end of the pass); only when something is to be done does it read the job and its pods
fresh and decide again, so that no fault is counted twice and no pod is created twice. Then it
writes status (optimistically, with the resourceVersion read), posts the Events and applies the
actions. `finalize_job` is the same for a deleted job (the finalizer's work).
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from rtj_operator import decide, events, metrics, observe
from rtj_operator.runtime import kube
from rtj_operator.runtime.context import OperatorContext
from rtj_operator.runtime.queue import DEBOUNCE_SECONDS, JobKey, JobRunner, WorkQueue
from rtj_operator.validation import JobValidationError

# What a decision was made from: the plan, the job as seen, and the body it was read from.
Decided = tuple[decide.Plan, observe.JobView, dict[str, Any]]


def new_context(client: kube.Kube, *, metrics_port: int | None = None) -> OperatorContext:
    """An operator's state, its work queue running `run_pass`."""
    ctx = OperatorContext(kube=client, metrics_port=metrics_port)
    ctx.queue = WorkQueue(functools.partial(run_pass, ctx))
    return ctx


def _now() -> datetime:
    return datetime.now(UTC)


async def run_pass(ctx: OperatorContext, key: JobKey, runner: JobRunner) -> str:
    """One pass over one job; returns the result label for metrics."""
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
    if plan.status_changed and not await _write_status(ctx, body, plan.status):
        return "conflict"
    runner.offsets = dict(plan.offsets)
    if ensure_base:
        runner.ensure_base = False
    for event in plan.events:
        post_event(body, event)
    for action in plan.actions:
        await asyncio.to_thread(ctx.kube.apply, action, key[0])
    count_writes(ctx)
    metrics.observe_pass(
        key[0],
        key[1],
        state=plan.status.get("state"),
        counters=plan.counters,
        old_restarts=view.status.get("restarts") or {},
        new_restarts=plan.status.get("restarts") or {},
        goodput_percent=(plan.status.get("progress") or {}).get("goodputPercent"),
    )
    if plan.requeue_after is not None:
        await ctx.queue.trigger(key, delay=plan.requeue_after)
    return "acted" if plan.actions or plan.status_changed else "idle"


async def _decide(
    ctx: OperatorContext, key: JobKey, runner: JobRunner, body: dict[str, Any], *, ensure_base: bool
) -> Decided | str:
    """Decide from the indexes; when something is to be done, decide again from fresh reads."""
    try:
        view = observe.observe_job(body)
    except JobValidationError:
        fresh = await asyncio.to_thread(ctx.kube.get_job, *key)
        return "gone" if fresh is None else await _invalid(ctx, fresh)
    observed = observe.observe(
        ctx.job_pods(key), ctx.all_nodes(), ensure_base=ensure_base, offsets=runner.offsets
    )
    plan = decide.reconcile(view, observed, _now())
    if not plan.actions and not plan.status_changed:
        return plan, view, body
    # Something is to be done: the indexes may lag our own writes.
    return await _decide_fresh(ctx, key, runner, ensure_base=ensure_base)


async def _decide_fresh(
    ctx: OperatorContext, key: JobKey, runner: JobRunner, *, ensure_base: bool
) -> Decided | str:
    fresh = await asyncio.to_thread(ctx.kube.get_job, *key)
    if fresh is None or fresh.get("metadata", {}).get("deletionTimestamp"):
        return "gone"
    try:
        view = observe.observe_job(fresh)
    except JobValidationError:
        return await _invalid(ctx, fresh)
    pods = await asyncio.to_thread(ctx.kube.list_pods, *key)
    nodes = await _nodes_confirmed(ctx, pods, view.status)
    observed = observe.observe(pods, nodes, ensure_base=ensure_base, offsets=runner.offsets)
    return decide.reconcile(view, observed, _now()), view, fresh


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
    for name in sorted(n for n in referenced if n and n not in known):
        node = await asyncio.to_thread(ctx.kube.get_node, name)
        if node is not None:
            nodes.append(node)
    return nodes


async def _write_status(ctx: OperatorContext, body: Mapping[str, Any], status: dict[str, Any]) -> bool:
    """Write status with the resourceVersion read; False (and a new pass soon) on a conflict."""
    metadata = body.get("metadata", {})
    namespace, name = metadata["namespace"], metadata["name"]
    try:
        await asyncio.to_thread(
            ctx.kube.patch_status, namespace, name, status, metadata.get("resourceVersion")
        )
    except kube.ConflictError:
        # Someone (kopf's own annotations, a spec edit) wrote the job since it was read: decide
        # again from the newer version; nothing was done on the stale decision.
        await ctx.queue.trigger((namespace, name), delay=DEBOUNCE_SECONDS)
        return False
    return True


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
    if changed and not await _write_status(ctx, body, status):
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
    for verb, count in ctx.kube.writes.items():
        metrics.WRITES.labels(verb=verb).inc(count)
    ctx.kube.writes.clear()


def forget(ctx: OperatorContext, key: JobKey) -> None:
    ctx.queue.forget(key)
    metrics.forget_job(*key)


def post_event(body: Mapping[str, Any], event: decide.Event) -> None:
    """Post an Event on the job (kopf.event reads apiVersion, kind and metadata of a Body)."""
    kopf.event(
        kopf.Body(cast(kopf.RawBody, dict(body))), type=event.type, reason=event.reason, message=event.message
    )


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A kopf Body (a view kopf may re-point at newer versions) as a plain dict of its own."""
    copied: dict[str, Any] = copy.deepcopy(dict(body))
    return copied
