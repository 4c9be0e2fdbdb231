"""kopf wiring: which events make a job reconcile, and how a pass is carried out.

Nothing here decides anything about a job: `observe` turns API objects into observations, `reconcile`
decides, `kube` talks to the API, `metrics` counts. This module:

- registers the kopf handlers on a registry (`register`), so that an operator can be built per
  process or per test: indexes of pods (by job), nodes and jobs; job create/update/resume/delete;
  pod and node events; a timer as a safety net;
- runs at most one pass per job at a time and coalesces bursts of events into one pass (`Runner`);
- carries out a pass: decide from the indexes, and only when something is to be done, read the job
  and its pods fresh, decide again, write status (optimistically, with the resourceVersion read),
  then apply the actions and post the events. An idle job costs no API write at all.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from rtj_operator import constants, decide, kube, metrics, observe
from rtj_operator import events as rtj_events
from rtj_operator.progress import RestartOffset
from rtj_operator.validation import JobValidationError

logger = logging.getLogger(__name__)

# The safety-net timer: a pass per job this often even when no event arrives (seconds). Events and
# the plan's own requeue times drive everything; this only catches a missed watch event.
TIMER_INTERVAL_SECONDS = 60.0
# Bursts of pod events (N pods created, each going Pending -> Running) are coalesced into one pass.
DEBOUNCE_SECONDS = 0.2
# After a failed pass (API error) the job is tried again this much later, doubling per consecutive
# failure up to the maximum, so that a job that keeps failing does not hammer the API server.
RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0

JobKey = tuple[str, str]  # (namespace, name)


@dataclass
class JobRunner:
    """Per-job serialization: one pass at a time, re-run while new triggers arrive."""

    dirty: bool = False
    ensure_base: bool = False
    task: asyncio.Task[None] | None = None
    wakeup: asyncio.TimerHandle | None = None
    failures: int = 0
    offsets: dict[str, RestartOffset] = field(default_factory=dict)


@dataclass
class OperatorContext:
    """The operator's state, passed to every handler as kopf's `memo`."""

    kube: kube.Kube
    runners: dict[JobKey, JobRunner] = field(default_factory=dict)
    # Filled by kopf: the indexes (see `register`), kept here so that passes started outside a
    # handler (wake-ups) can read them.
    jobs: kopf.Index[JobKey, dict[str, Any]] | None = None
    pods: kopf.Index[JobKey, dict[str, Any]] | None = None
    nodes: kopf.Index[str, dict[str, Any]] | None = None
    metrics_port: int | None = None
    passes: int = 0

    # kopf copies the memo into each handler's kwargs; it must behave like a kopf.Memo (a dict-like).
    def __copy__(self) -> OperatorContext:
        return self


def _first(store: Iterable[dict[str, Any]] | None) -> dict[str, Any] | None:
    return next(iter(store), None) if store is not None else None


def _now() -> datetime:
    return datetime.now(UTC)


def _nodes(ctx: OperatorContext) -> list[dict[str, Any]]:
    if ctx.nodes is None:
        return []
    return [body for store in ctx.nodes.values() for body in store]


async def trigger(
    ctx: OperatorContext, key: JobKey, *, ensure_base: bool = False, delay: float = 0.0
) -> None:
    """Ask for a pass of job `key`; passes never overlap and bursts coalesce into one."""
    runner = ctx.runners.setdefault(key, JobRunner())
    runner.ensure_base = runner.ensure_base or ensure_base
    if delay > 0:
        loop = asyncio.get_running_loop()
        if runner.wakeup is not None:
            runner.wakeup.cancel()
        runner.wakeup = loop.call_later(delay, lambda: asyncio.ensure_future(trigger(ctx, key)))
        return
    runner.dirty = True
    if runner.task is None or runner.task.done():
        runner.task = asyncio.create_task(_run(ctx, key, runner), name=f"rtj-reconcile-{key[0]}/{key[1]}")


async def _run(ctx: OperatorContext, key: JobKey, runner: JobRunner) -> None:
    await asyncio.sleep(DEBOUNCE_SECONDS)
    while runner.dirty:
        runner.dirty = False
        started = time.monotonic()
        try:
            result = await reconcile_job(ctx, key, runner)
            runner.failures = 0
        except Exception:  # one job's failure must never stop the others: log, count, retry later
            delay = min(MAX_RETRY_SECONDS, RETRY_SECONDS * 2**runner.failures)
            runner.failures += 1
            logger.exception("reconciling %s/%s failed; retrying in %ss", key[0], key[1], delay)
            result = "error"
            await trigger(ctx, key, delay=delay)
        metrics.RECONCILE_TOTAL.labels(result=result).inc()
        metrics.RECONCILE_DURATION.observe(time.monotonic() - started)
        ctx.passes += 1


async def reconcile_job(ctx: OperatorContext, key: JobKey, runner: JobRunner) -> str:
    """One pass over one job; returns the result label for metrics."""
    namespace, name = key
    body = _first(ctx.jobs.get(key) if ctx.jobs is not None else None)
    if body is None:
        _forget(ctx, key)
        return "gone"
    if body.get("metadata", {}).get("deletionTimestamp"):
        return "deleting"  # the finalizer handler (on.delete) does the rest

    # First decide from the indexes: cheap, and for an idle job the end of the pass.
    ensure_base = runner.ensure_base
    try:
        view = observe.observe_job(body)
    except JobValidationError:
        fresh = await asyncio.to_thread(ctx.kube.get_job, namespace, name)
        if fresh is None:
            return "gone"
        return await _invalid(ctx, fresh)
    pods = list(ctx.pods.get(key, ()) if ctx.pods is not None else ())
    observed = observe.observe(pods, _nodes(ctx), ensure_base=ensure_base, offsets=runner.offsets)
    plan = decide.reconcile(view, observed, _now())
    if plan.actions or plan.status_changed:
        # Something is to be done: decide again from a fresh read (the indexes may lag our own
        # writes), so that no fault is counted twice and no pod is created twice.
        fresh = await asyncio.to_thread(ctx.kube.get_job, namespace, name)
        if fresh is None or fresh.get("metadata", {}).get("deletionTimestamp"):
            return "gone"
        try:
            view = observe.observe_job(fresh)
        except JobValidationError:
            return await _invalid(ctx, fresh)
        pods = await asyncio.to_thread(ctx.kube.list_pods, namespace, name)
        nodes = await _nodes_confirmed(ctx, pods, view.status)
        observed = observe.observe(pods, nodes, ensure_base=ensure_base, offsets=runner.offsets)
        plan = decide.reconcile(view, observed, _now())
        body = fresh

    if plan.status_changed:
        try:
            await asyncio.to_thread(
                ctx.kube.patch_status,
                namespace,
                name,
                plan.status,
                body.get("metadata", {}).get("resourceVersion"),
            )
        except kube.ConflictError:
            # Someone (kopf's own annotations, a spec edit) wrote the job since it was read: decide
            # again from the newer version; nothing was done on the stale decision.
            await trigger(ctx, key, delay=DEBOUNCE_SECONDS)
            return "conflict"
    runner.offsets = dict(plan.offsets)
    runner.ensure_base = False if ensure_base else runner.ensure_base
    for event in plan.events:
        kopf.event(_body(body), type=event.type, reason=event.reason, message=event.message)
    for action in plan.actions:
        await asyncio.to_thread(ctx.kube.apply, action, namespace)
    _count_writes(ctx)
    metrics.observe_pass(
        namespace,
        name,
        state=plan.status.get("state"),
        counters=plan.counters,
        old_restarts=view.status.get("restarts") or {},
        new_restarts=plan.status.get("restarts") or {},
        goodput_percent=(plan.status.get("progress") or {}).get("goodputPercent"),
    )
    if plan.requeue_after is not None:
        await trigger(ctx, key, delay=plan.requeue_after)
    return "acted" if plan.actions or plan.status_changed else "idle"


async def _nodes_confirmed(
    ctx: OperatorContext, pods: list[dict[str, Any]], status: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The indexed nodes, plus any node a pod or status refers to that the index does not know yet.

    A node missing from the index reads as deleted, which excludes it for good; the node watch can
    lag the pod watch (a pod bound to a node added a moment ago), so absence is confirmed by a read.
    """
    nodes = _nodes(ctx)
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
    if changed:
        try:
            await asyncio.to_thread(
                ctx.kube.patch_status,
                metadata["namespace"],
                metadata["name"],
                status,
                metadata.get("resourceVersion"),
            )
        except kube.ConflictError:
            await trigger(ctx, (metadata["namespace"], metadata["name"]), delay=DEBOUNCE_SECONDS)
            return "conflict"
    for event in emitted:
        kopf.event(_body(body), type=event.type, reason=event.reason, message=event.message)
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


def _count_writes(ctx: OperatorContext) -> None:
    for verb, count in ctx.kube.writes.items():
        counted = metrics.WRITES.labels(verb=verb)
        counted.inc(count)
    ctx.kube.writes.clear()


def _forget(ctx: OperatorContext, key: JobKey) -> None:
    runner = ctx.runners.pop(key, None)
    if runner is not None and runner.wakeup is not None:
        runner.wakeup.cancel()
    metrics.forget_job(*key)


def register(registry: kopf.OperatorRegistry) -> None:
    """Register the operator's handlers on `registry` (one registry per operator instance)."""
    group, version, plural = constants.GROUP, constants.VERSION, constants.PLURAL

    @kopf.on.startup(id="configure", registry=registry)
    def configure(**kwargs: Any) -> None:
        settings: kopf.OperatorSettings = kwargs["settings"]
        memo: OperatorContext = kwargs["memo"]
        settings.persistence.finalizer = constants.FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=constants.GROUP, key="last-handled-configuration"
        )
        # Ask the API server to end every watch after 5 minutes and give up on a silent connection
        # after 6: a watch that silently died (a dropped TCP connection, a restarted API server
        # behind a load balancer) would otherwise leave the operator blind to node losses. kopf
        # re-lists and re-watches from the last resourceVersion, so the cost is one request.
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 360
        settings.watching.connect_timeout = 10
        # Only the operator's own Events (posted with kopf.event) and warnings from kopf reach the
        # API: kopf's per-handler "succeeded" messages would be writes for idle jobs.
        settings.posting.level = logging.WARNING
        settings.posting.reporting_component = "rtj-operator"
        # Serve the jobs' resource without watching CRDs and namespaces (no RBAC for them needed).
        settings.scanning.disabled = True
        settings.execution.max_workers = 8
        if memo.metrics_port is not None and metrics.start_server(memo.metrics_port):
            logger.info("metrics on :%d/metrics", memo.metrics_port)

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo:
        memo: OperatorContext = kwargs["memo"]
        config = memo.kube.configuration
        token = (config.api_key or {}).get("authorization") or (config.api_key or {}).get("BearerToken")
        scheme = None
        if token and " " in token:
            scheme, token = token.split(" ", 1)
        return kopf.ConnectionInfo(
            server=config.host,
            ca_path=config.ssl_ca_cert,
            insecure=not config.verify_ssl,
            scheme=scheme or ("Bearer" if token else None),
            token=token,
            certificate_path=config.cert_file,
            private_key_path=config.key_file,
            username=config.username or None,
            password=config.password or None,
        )

    # -- indexes: what reconcile reads without an API call --

    @kopf.index(group, version, plural, id="jobs_index", registry=registry)
    def jobs_index(**kwargs: Any) -> Any:
        return {(kwargs["namespace"], kwargs["name"]): _plain(kwargs["body"])}

    @kopf.index("pods", labels={constants.LABEL_JOB: kopf.PRESENT}, id="pods_index", registry=registry)
    def pods_index(**kwargs: Any) -> Any:
        return {(kwargs["namespace"], kwargs["labels"][constants.LABEL_JOB]): _plain(kwargs["body"])}

    @kopf.index("nodes", id="nodes_index", registry=registry)
    def nodes_index(**kwargs: Any) -> Any:
        return {kwargs["name"]: _plain(kwargs["body"])}

    # kopf hands every resource handler the indexes as keyword arguments named after the index
    # functions; they are kept in the context for passes started outside a handler (wake-ups).
    def remember(memo: OperatorContext, kwargs: Mapping[str, Any]) -> None:
        if memo.jobs is None:
            memo.jobs = kwargs.get("jobs_index")
            memo.pods = kwargs.get("pods_index")
            memo.nodes = kwargs.get("nodes_index")

    # -- the jobs --

    def job_key(kwargs: Mapping[str, Any]) -> JobKey:
        return (str(kwargs["namespace"]), str(kwargs["name"]))

    @kopf.on.resume(group, version, plural, id="job_resumed", registry=registry)
    @kopf.on.create(group, version, plural, id="job_created", registry=registry)
    @kopf.on.update(group, version, plural, field="spec", id="job_updated", registry=registry)
    async def job_changed(**kwargs: Any) -> None:
        memo: OperatorContext = kwargs["memo"]
        remember(memo, kwargs)
        await trigger(memo, job_key(kwargs), ensure_base=True)

    @kopf.timer(group, version, plural, interval=TIMER_INTERVAL_SECONDS, id="job_timer", registry=registry)
    async def job_timer(**kwargs: Any) -> None:
        memo: OperatorContext = kwargs["memo"]
        remember(memo, kwargs)
        await trigger(memo, job_key(kwargs))

    @kopf.on.delete(group, version, plural, id="job_deleted", registry=registry)
    async def job_deleted(**kwargs: Any) -> None:
        memo: OperatorContext = kwargs["memo"]
        remember(memo, kwargs)
        key = job_key(kwargs)
        body: kopf.Body = kwargs["body"]
        try:
            view = observe.observe_job(_plain(body))
        except JobValidationError:
            _forget(memo, key)
            return  # nothing was ever created for an invalid job
        taints = {
            node["metadata"]["name"]: [
                (str(t.get("key")), str(t.get("value", "")), str(t.get("effect")))
                for t in node.get("spec", {}).get("taints") or []
            ]
            for node in _nodes(memo)
        }
        for action in decide.finalize(view, taints):
            await asyncio.to_thread(memo.kube.apply, action, key[0])
            if isinstance(action, decide.DeleteObject):
                kopf.event(
                    body,
                    type=rtj_events.NORMAL,
                    reason=rtj_events.STORAGE_DELETED,
                    message=f"{action.kind} {action.name} deleted (retentionPolicy: Delete)",
                )
        _count_writes(memo)
        _forget(memo, key)

    # -- what the jobs' pods and the nodes do --

    @kopf.on.event("pods", labels={constants.LABEL_JOB: kopf.PRESENT}, id="pod_event", registry=registry)
    async def pod_event(**kwargs: Any) -> None:
        memo: OperatorContext = kwargs["memo"]
        remember(memo, kwargs)
        await trigger(memo, (str(kwargs["namespace"]), kwargs["labels"][constants.LABEL_JOB]))

    @kopf.on.event("nodes", id="node_event", registry=registry)
    async def node_event(**kwargs: Any) -> None:
        memo: OperatorContext = kwargs["memo"]
        remember(memo, kwargs)
        if kwargs.get("type") is None:
            return  # the initial listing: the jobs' own resume handlers cover it
        name = kwargs["name"]
        affected = [
            key
            for key, store in (memo.pods or {}).items()
            if any(pod.get("spec", {}).get("nodeName") == name for pod in store)
        ]
        for key in affected:
            await trigger(memo, key)


def _body(raw: Mapping[str, Any]) -> kopf.Body:
    """A plain dict as the kopf Body that kopf.event takes (it reads apiVersion, kind and metadata)."""
    return kopf.Body(cast(kopf.RawBody, dict(raw)))


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A kopf Body (a view kopf may re-point at newer versions) as a plain dict of its own."""
    copied: dict[str, Any] = copy.deepcopy(dict(body))
    return copied
