"""kopf wiring: which events make a job reconcile. Nothing here decides or calls the API itself.

`register(registry)` registers, on one registry per operator instance (per process or per test):
the settings (on.startup) and the login; indexes of jobs, pods (by job) and nodes; job
create/update/resume (a pass that also asserts the base children), a timer as a safety net, and
delete (the finalizer: `job_pass.finalize_job`); every job event, for a status written by someone
else (`job_pass.overwritten`); pod and node events; a daemon per job that reads its trainers'
progress endpoints (`scrape.ProgressScraper.follow`). Every handler only records kopf's indexes in
the context and asks the work queue for a pass (`queue.WorkQueue.trigger`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from rtj_operator import constants, observe
from rtj_operator.runtime import job_pass
from rtj_operator.runtime.context import OperatorContext
from rtj_operator.runtime.queue import JobKey

logger = logging.getLogger(__name__)

# The safety-net timer: a pass per job this often even when no event arrives (seconds). Events and
# the plan's own requeue times drive everything; this only catches a missed watch event.
TIMER_INTERVAL_SECONDS = 60.0

_JOBS = (constants.GROUP, constants.VERSION, constants.PLURAL)


def register(registry: kopf.OperatorRegistry) -> None:
    """Register the operator's handlers on `registry` (one registry per operator instance)."""
    kopf.on.startup(id="configure", registry=registry)(configure)
    kopf.on.login(id="login", registry=registry)(login)
    # Indexes: what a pass reads without an API call.
    kopf.index(*_JOBS, id="jobs_index", registry=registry)(jobs_index)
    kopf.index("pods", labels={constants.LABEL_JOB: kopf.PRESENT}, id="pods_index", registry=registry)(
        pods_index
    )
    kopf.index("nodes", id="nodes_index", registry=registry)(nodes_index)
    # The jobs.
    kopf.on.resume(*_JOBS, id="job_resumed", registry=registry)(job_changed)
    kopf.on.create(*_JOBS, id="job_created", registry=registry)(job_changed)
    kopf.on.update(*_JOBS, field="spec", id="job_updated", registry=registry)(job_changed)
    kopf.timer(*_JOBS, interval=TIMER_INTERVAL_SECONDS, id="job_timer", registry=registry)(job_timer)
    kopf.on.delete(*_JOBS, id="job_deleted", registry=registry)(job_deleted)
    kopf.on.event(*_JOBS, id="job_event", registry=registry)(job_event)
    kopf.daemon(*_JOBS, id="job_progress", cancellation_timeout=10.0, registry=registry)(job_progress)
    # What the jobs' pods and the nodes do.
    kopf.on.event("pods", labels={constants.LABEL_JOB: kopf.PRESENT}, id="pod_event", registry=registry)(
        pod_event
    )
    kopf.on.event("nodes", id="node_event", registry=registry)(node_event)


def configure(**kwargs: Any) -> None:
    settings: kopf.OperatorSettings = kwargs["settings"]
    memo: OperatorContext = kwargs["memo"]
    settings.persistence.finalizer = constants.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=constants.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=constants.GROUP, key="last-handled-configuration"
    )
    # Ask the API server to end every watch after 5 minutes, and end it ourselves after 5.5. A
    # watch that stays silent for `watch_inactivity_seconds` is dropped with its connection and
    # started again from the last resourceVersion (one request, no re-list): a connection that a
    # network fault froze silently (a dead NAT or load-balancer entry, a stalled proxy) would
    # otherwise blind the operator to node losses until the kernel or the timeouts above noticed
    # (kopf's default is 70 s; the API server's bookmarks come only about once a minute, so a quiet
    # watch is re-made every `watch_inactivity_seconds`, which costs little).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 5
    settings.watching.inactivity_timeout = memo.watch_inactivity_seconds
    # kopf's own short requests (finalizer and annotation patches, Events, the initial lists): a
    # request stuck on a frozen connection fails after this and kopf retries it on a new one.
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 5
    # Only the operator's own Events (posted with kopf.event) and warnings from kopf reach the
    # API: kopf's per-handler "succeeded" messages would be writes for idle jobs.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "rtj-operator"
    # Serve the jobs' resource without watching CRDs and namespaces (no RBAC for them needed).
    settings.scanning.disabled = True
    settings.execution.max_workers = 8


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


# -- indexes --


# kopf calls the index functions on every watch event (and on the initial listing): each is a sign
# that the API server is heard (see api_liveness.ApiLiveness).


def jobs_index(**kwargs: Any) -> Any:
    kwargs["memo"].api_liveness.watch_event()
    return {(kwargs["namespace"], kwargs["name"]): job_pass.plain(kwargs["body"])}


def pods_index(**kwargs: Any) -> Any:
    kwargs["memo"].api_liveness.watch_event()
    return {(kwargs["namespace"], kwargs["labels"][constants.LABEL_JOB]): job_pass.plain(kwargs["body"])}


def nodes_index(**kwargs: Any) -> Any:
    kwargs["memo"].api_liveness.watch_event()
    return {kwargs["name"]: job_pass.plain(kwargs["body"])}


def remember_indexes(kwargs: Mapping[str, Any]) -> OperatorContext:
    """The context, with the indexes kopf hands every resource handler (named after the index
    functions) kept for passes started outside a handler (wake-ups)."""
    memo: OperatorContext = kwargs["memo"]
    if memo.jobs is None:
        memo.jobs = kwargs.get("jobs_index")
        memo.pods = kwargs.get("pods_index")
        memo.nodes = kwargs.get("nodes_index")
    return memo


def _job_key(kwargs: Mapping[str, Any]) -> JobKey:
    return (str(kwargs["namespace"]), str(kwargs["name"]))


# -- the jobs --


async def job_changed(**kwargs: Any) -> None:
    memo = remember_indexes(kwargs)
    await memo.queue.trigger(_job_key(kwargs), ensure_base=True)


async def job_timer(**kwargs: Any) -> None:
    memo = remember_indexes(kwargs)
    await memo.queue.trigger(_job_key(kwargs))


async def job_event(**kwargs: Any) -> None:
    """Any change of a job, its status included: the spec handlers above cover spec changes; a status
    that differs from the operator's last write was written by someone else and is corrected now."""
    memo = remember_indexes(kwargs)
    key = _job_key(kwargs)
    runner = memo.queue.runners.get(key)
    if kwargs.get("type") is None or runner is None:
        return  # the initial listing (resume handlers cover it), or a job not reconciled yet
    if job_pass.overwritten(runner, kwargs["body"]):
        await memo.queue.trigger(key)


async def job_progress(**kwargs: Any) -> None:
    """While the job exists: read its workers' progress endpoints, a pass when a report changed."""
    memo = remember_indexes(kwargs)
    key = _job_key(kwargs)
    await memo.progress.follow(key, lambda: memo.job_pods(key), lambda: memo.queue.trigger(key))


async def job_deleted(**kwargs: Any) -> None:
    memo = remember_indexes(kwargs)
    await job_pass.finalize_job(memo, _job_key(kwargs), kwargs["body"])


# -- what the jobs' pods and the nodes do --


async def pod_event(**kwargs: Any) -> None:
    memo = remember_indexes(kwargs)
    await memo.queue.trigger((str(kwargs["namespace"]), kwargs["labels"][constants.LABEL_JOB]))


async def node_event(**kwargs: Any) -> None:
    memo = remember_indexes(kwargs)
    if kwargs.get("type") is None:
        return  # the initial listing: the jobs' own resume handlers cover it
    if kwargs.get("type") == "DELETED":
        observe.forget_node(kwargs["name"])
    for key in sorted({*memo.jobs_on_node(kwargs["name"]), *memo.jobs_waiting_for_nodes()}):
        await memo.queue.trigger(key)
