"""Prometheus metrics of the operator (prometheus-client), exported on `--metrics-port`.

`runtime.passes` updates them after each reconcile pass from the plan's counters and the job's state; the
HTTP exporter is started from kopf's on.startup handler. Names follow the project's habits: `rtj_`
prefix, base units, `_total` on counters, and no unbounded labels: the only per-job series
(`rtj_job_goodput_ratio`) is removed when its job is deleted.

The collectors are process-wide (prometheus-client registers them once); an operator restarted in
the same process (the tests do that) keeps counting into them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import prometheus_client

from rtj_operator.api import JobState

RECONCILE_TOTAL = prometheus_client.Counter("rtj_reconcile_total", "Reconcile passes, by result.", ["result"])
RECONCILE_DURATION = prometheus_client.Histogram(
    "rtj_reconcile_duration_seconds",
    "Time of one reconcile pass, API calls included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
NODE_LOSSES = prometheus_client.Counter("rtj_node_losses_total", "Workers lost with their node.")
POD_REPLACEMENTS = prometheus_client.Counter(
    "rtj_pod_replacements_total", "Worker pods replaced (gang restarts count once per lost worker)."
)
GANG_RESTARTS = prometheus_client.Counter("rtj_gang_restarts_total", "Restarts of every worker pod of a job.")
RESTARTS = prometheus_client.Counter(
    "rtj_restarts_total", "Recoveries by layer: in_process, in_job, pod_replacement.", ["layer"]
)
JOB_GOODPUT = prometheus_client.Gauge(
    "rtj_job_goodput_ratio",
    "Training goodput of a job (useful step time / wall time), 0-1.",
    ["namespace", "job"],
)
JOBS = prometheus_client.Gauge("rtj_jobs", "Jobs served, by state.", ["state"])
WRITES = prometheus_client.Counter(
    "rtj_api_writes_total", "API writes made by the operator's own code.", ["verb"]
)

_LAYERS = {"inProcess": "in_process", "inJob": "in_job", "podReplacement": "pod_replacement"}
_lock = threading.Lock()
_server_started: set[int] = set()
_states: dict[tuple[str, str], str] = {}


def start_server(port: int) -> bool:
    """Start the exporter on `port` once per process; False if it was already running."""
    with _lock:
        if port in _server_started:
            return False
        prometheus_client.start_http_server(port)
        _server_started.add(port)
        return True


def observe_pass(  # noqa: PLR0913 - keyword-only, each a named field; callers pass them by name
    namespace: str,
    job: str,
    *,
    state: str | None,
    counters: Mapping[str, int],
    old_restarts: Mapping[str, object],
    new_restarts: Mapping[str, object],
    goodput_percent: float | None,
) -> None:
    """Record one pass's effects: counters from the plan, restart deltas from status, gauges."""
    NODE_LOSSES.inc(counters.get("node_losses", 0))
    POD_REPLACEMENTS.inc(counters.get("pod_replacements", 0))
    GANG_RESTARTS.inc(counters.get("gang_restarts", 0))
    for key, layer in _LAYERS.items():
        before, after = old_restarts.get(key), new_restarts.get(key)
        if isinstance(before, int) and isinstance(after, int) and after > before:
            RESTARTS.labels(layer=layer).inc(after - before)
        elif before is None and isinstance(after, int) and after > 0:
            RESTARTS.labels(layer=layer).inc(after)
    if goodput_percent is not None:
        JOB_GOODPUT.labels(namespace=namespace, job=job).set(goodput_percent / 100.0)
    if state is not None:
        with _lock:
            _states[(namespace, job)] = state
            _refresh_states()


def forget_job(namespace: str, job: str) -> None:
    """A deleted job leaves no series behind."""
    try:
        JOB_GOODPUT.remove(namespace, job)
    except KeyError:
        pass
    with _lock:
        _states.pop((namespace, job), None)
        _refresh_states()


def _refresh_states() -> None:
    counts = dict.fromkeys((state.value for state in JobState), 0)
    for state in _states.values():
        counts[state] = counts.get(state, 0) + 1
    for state, count in counts.items():
        JOBS.labels(state=state).set(count)
