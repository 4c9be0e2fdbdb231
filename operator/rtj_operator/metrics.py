"""Prometheus metrics of the operator (prometheus-client), exported on `--metrics-port`.

`runtime.job_pass` updates them after each reconcile pass from the plan's counters and the job's status;
`runtime.scrape` counts its reads of the trainers' progress endpoints and `runtime.api_liveness` the failed
calls of the operator's client; the HTTP exporter is started with the operator (`main.run_operator`),
before leader election, so a standby is scraped too and says it stands by (`rtj_operator_leading`).
The chart's alert rules and dashboard (charts/resilient-training-operator/) query these series.

Names follow the project's habits: `rtj_` prefix, base units, `_total` on counters, and no unbounded
labels: the per-job series (`rtj_job_*`, labelled `namespace` and `job`) come from one snapshot per
served job (`JobSeries`), which is dropped when the job is deleted.

The collectors are process-wide (prometheus-client registers them once); an operator restarted in
the same process (the tests do that) keeps counting into them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from rtj_contract.times import epoch_seconds

from rtj_operator.api import (
    CheckpointAdviceStatus,
    CheckpointStatus,
    ConditionStatus,
    JobState,
    ProgressStatus,
    ResilientTrainingJobStatus,
)
from rtj_operator.decide import conditions as cond

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
SURGE_PODS = prometheus_client.Counter(
    "rtj_surge_pods_total",
    "Surge pods, by outcome: created (a worker terminating gracefully without a spare to take its "
    "place), used (its replacement was pinned to the surge pod's node).",
    ["outcome"],
)
RESTARTS = prometheus_client.Counter(
    "rtj_restarts_total", "Recoveries by layer: in_process, in_job, pod_replacement.", ["layer"]
)
JOBS = prometheus_client.Gauge("rtj_jobs", "Jobs served, by state.", ["state"])
WRITES = prometheus_client.Counter(
    "rtj_api_writes_total", "API writes made by the operator's own code.", ["verb"]
)
PROGRESS_SCRAPES = prometheus_client.Counter(
    "rtj_progress_scrapes_total",
    "Reads of the trainers' progress endpoints, by result: "
    "ok, no_report, invalid, too_large, timeout, error.",
    ["result"],
)
API_ERRORS = prometheus_client.Counter(
    "rtj_api_errors_total",
    "API calls of the operator's own client that failed, by class: "
    "timeout, connection, throttled (429), server (5xx), refused (other 4xx), credentials.",
    ["class"],
)
LEADING = prometheus_client.Gauge(
    "rtj_operator_leading",
    "1 while this replica acts on the jobs (the leader, or the only replica without leader "
    "election), 0 while it stands by.",
)
PROGRESS_SCRAPE_DURATION = prometheus_client.Histogram(
    "rtj_progress_scrape_duration_seconds",
    "Time of one read of a trainer's progress endpoint.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
PROGRESS_SCRAPE_ROUND_DURATION = prometheus_client.Histogram(
    "rtj_progress_scrape_round_seconds",
    "Time of one round of reads of every progress endpoint of one job.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

_LAYERS = {"inProcess": "in_process", "inJob": "in_job", "podReplacement": "pod_replacement"}
_lock = threading.Lock()
_server_started: set[int] = set()
_states: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class JobSeries:
    """What one job's status says, as its per-job series show it (None: no sample)."""

    goodput_ratio: float | None = None
    step: float | None = None
    step_seconds: float | None = None
    progress_time: float | None = None
    checkpoint_step: float | None = None
    checkpoint_time: float | None = None
    workers_ready: float | None = None
    workers_desired: float | None = None
    restarts: tuple[tuple[str, float], ...] = ()
    stalled: float | None = None
    last_recovery_seconds: float | None = None
    advised_interval_steps: float | None = None
    configured_interval_steps: float | None = None
    samples: float | None = None
    tokens: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    state: str | None = None
    failures_used: float | None = None
    failures_allowed: float | None = None
    excluded_nodes: float | None = None

    @classmethod
    def from_status(
        cls,
        status: ResilientTrainingJobStatus | Mapping[str, object],
        goodput_percent: float | None,
        failures_allowed: int | None = None,
    ) -> JobSeries:
        """From the status as decided (a pass's plan) or as stored (its JSON form, read by the models)."""
        if not isinstance(status, ResilientTrainingJobStatus):
            status = ResilientTrainingJobStatus.read(status)
        progress = status.progress or ProgressStatus()
        checkpoint = status.last_checkpoint or CheckpointStatus()
        restarts = status.restarts.model_dump(by_alias=True) if status.restarts is not None else {}
        advice = status.checkpoint_advice or CheckpointAdviceStatus()
        stalled = next((c for c in status.conditions if c.type == cond.COND_STALLED), None)
        return cls(
            goodput_ratio=goodput_percent / 100.0 if goodput_percent is not None else None,
            step=_number(progress.step),
            step_seconds=progress.step_time_seconds,
            progress_time=_epoch(progress.update_time),
            checkpoint_step=_number(checkpoint.step),
            checkpoint_time=_epoch(checkpoint.time),
            workers_ready=_number(status.workers.ready) if status.workers is not None else None,
            workers_desired=_number(status.workers.desired) if status.workers is not None else None,
            restarts=tuple(
                (layer, value)
                for key, layer in _LAYERS.items()
                if (value := _number(restarts.get(key))) is not None
            ),
            stalled=float(stalled.status == ConditionStatus.TRUE) if stalled is not None else None,
            last_recovery_seconds=status.last_recovery.duration_seconds if status.last_recovery else None,
            advised_interval_steps=_number(advice.recommended_interval_steps),
            configured_interval_steps=_number(advice.configured_interval_steps),
            samples=_number(progress.samples),
            tokens=_number(progress.tokens),
            samples_per_second=progress.samples_per_second,
            tokens_per_second=progress.tokens_per_second,
            state=status.state.value if status.state is not None else None,
            failures_used=_number(status.budget.failures_used if status.budget is not None else 0),
            failures_allowed=_number(failures_allowed),
            excluded_nodes=float(len(status.excluded_nodes)),
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


_epoch = epoch_seconds


# (name, help, JobSeries field) of each per-job gauge.
_JOB_GAUGES = (
    (
        "rtj_job_goodput_ratio",
        "Training goodput of a job (useful step time / wall time), 0-1.",
        "goodput_ratio",
    ),
    ("rtj_job_step", "The highest training step any worker of the job reported.", "step"),
    (
        "rtj_job_step_duration_seconds",
        "Duration of a step, as the most advanced worker reported.",
        "step_seconds",
    ),
    (
        "rtj_job_progress_timestamp_seconds",
        "When the job's newest progress report was made (Unix time).",
        "progress_time",
    ),
    ("rtj_job_checkpoint_last_step", "Step of the job's newest committed checkpoint.", "checkpoint_step"),
    (
        "rtj_job_checkpoint_last_timestamp_seconds",
        "When the job's newest checkpoint was committed (Unix time).",
        "checkpoint_time",
    ),
    ("rtj_job_workers_ready", "Ready worker pods of the job.", "workers_ready"),
    ("rtj_job_workers_desired", "Worker pods the job asks for (spec.nodes).", "workers_desired"),
    (
        "rtj_job_stalled",
        "1 while every worker of the job is ready but its training step does not advance (Stalled).",
        "stalled",
    ),
    (
        "rtj_job_last_recovery_seconds",
        "Duration of the job's newest recovery (status.lastRecovery): from the fault to training's return.",
        "last_recovery_seconds",
    ),
    (
        "rtj_job_checkpoint_advised_interval_steps",
        "The checkpoint interval the job's save cost and fault rate advise (Young/Daly), in steps.",
        "advised_interval_steps",
    ),
    (
        "rtj_job_checkpoint_interval_steps",
        "The job's configured checkpoint interval (spec.checkpoint.intervalSteps), in steps.",
        "configured_interval_steps",
    ),
    (
        "rtj_job_samples_per_second",
        "A job's recent throughput in samples per second of useful step time, as its script reports.",
        "samples_per_second",
    ),
    (
        "rtj_job_tokens_per_second",
        "A job's recent throughput in tokens per second of useful step time, as its script reports.",
        "tokens_per_second",
    ),
    (
        "rtj_job_failures_used",
        "Pod replacements charged to a job's failure budget (status.budget.failuresUsed).",
        "failures_used",
    ),
    (
        "rtj_job_failures_allowed",
        "The replacements a job's failure budget allows (spec.failurePolicy.maxNodeReplacements).",
        "failures_allowed",
    ),
    (
        "rtj_job_excluded_nodes",
        "Nodes a job no longer schedules onto after their faults (status.excludedNodes).",
        "excluded_nodes",
    ),
)
# (name without _total, help, JobSeries field) of each per-job counter of the script's own counts.
_JOB_COUNTERS = (
    (
        "rtj_job_samples",
        "Samples a job trained on, as its script reports them (status.progress.samples).",
        "samples",
    ),
    (
        "rtj_job_tokens",
        "Tokens a job trained on, as its script reports them (status.progress.tokens).",
        "tokens",
    ),
)
_jobs: dict[tuple[str, str], JobSeries] = {}


class _JobCollector(Collector):
    """The per-job series, from the snapshot each pass leaves (`observe_pass`)."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with _lock:
            jobs = sorted(_jobs.items())
        for name, text, attribute in _JOB_GAUGES:
            yield _per_job(GaugeMetricFamily(name, text, labels=["namespace", "rtj_job"]), jobs, attribute)
        for name, text, attribute in _JOB_COUNTERS:
            yield _per_job(CounterMetricFamily(name, text, labels=["namespace", "rtj_job"]), jobs, attribute)
        restarts = CounterMetricFamily(
            "rtj_job_restarts",
            "Recoveries of a job by layer, as its status counts them.",
            labels=["namespace", "rtj_job", "layer"],
        )
        for (namespace, job), series in jobs:
            for layer, value in series.restarts:
                restarts.add_metric([namespace, job, layer], value)
        yield restarts
        yield _job_states(jobs)


def _job_states(jobs: list[tuple[tuple[str, str], JobSeries]]) -> GaugeMetricFamily:
    """One series per job and state, 1 for the state its status names (as kube-state-metrics does)."""
    family = GaugeMetricFamily(
        "rtj_job_state",
        "1 for the state a job's status names (status.state), 0 for the others.",
        labels=["namespace", "rtj_job", "state"],
    )
    for (namespace, job), series in jobs:
        if series.state is None:
            continue
        for state in JobState:
            family.add_metric([namespace, job, state.value], float(series.state == state.value))
    return family


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


def _per_job(family: _Family, jobs: list[tuple[tuple[str, str], JobSeries]], attribute: str) -> _Family:
    """`family` with each job's sample of the JobSeries field `attribute` (none where it is None)."""
    for (namespace, job), series in jobs:
        value = getattr(series, attribute)
        if value is not None:
            family.add_metric([namespace, job], value)
    return family


prometheus_client.REGISTRY.register(_JobCollector())


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
    status: ResilientTrainingJobStatus | Mapping[str, object] | None = None,
    failures_allowed: int | None = None,
) -> None:
    """Record one pass's effects: counters from the plan, restart deltas from status, gauges, and
    the job's series from its new `status`."""
    NODE_LOSSES.inc(counters.get("node_losses", 0))
    POD_REPLACEMENTS.inc(counters.get("pod_replacements", 0))
    GANG_RESTARTS.inc(counters.get("gang_restarts", 0))
    SURGE_PODS.labels("created").inc(counters.get("surges_created", 0))
    SURGE_PODS.labels("used").inc(counters.get("surges_used", 0))
    for key, layer in _LAYERS.items():
        before, after = old_restarts.get(key), new_restarts.get(key)
        if isinstance(before, int) and isinstance(after, int) and after > before:
            RESTARTS.labels(layer=layer).inc(after - before)
        elif before is None and isinstance(after, int) and after > 0:
            RESTARTS.labels(layer=layer).inc(after)
    with _lock:
        _jobs[(namespace, job)] = JobSeries.from_status(status or {}, goodput_percent, failures_allowed)
    if state is not None:
        with _lock:
            _states[(namespace, job)] = state
            _refresh_states()


def count_api_error(failure_class: str) -> None:
    API_ERRORS.labels(**{"class": failure_class}).inc()


def follow_leadership(acting: Callable[[], bool]) -> None:
    """`rtj_operator_leading` from now on reads `acting` (the process's newest operator's)."""
    LEADING.set_function(lambda: float(acting()))


def forget_job(namespace: str, job: str) -> None:
    """A deleted job leaves no series behind."""
    with _lock:
        _jobs.pop((namespace, job), None)
        _states.pop((namespace, job), None)
        _refresh_states()


def _refresh_states() -> None:
    counts = dict.fromkeys((state.value for state in JobState), 0)
    for state in _states.values():
        counts[state] = counts.get(state, 0) + 1
    for state, count in counts.items():
        JOBS.labels(state=state).set(count)
