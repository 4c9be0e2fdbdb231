"""The trainer's Prometheus metrics, rendered from its newest progress report.

``rtj_trainer.runtime.endpoint`` serves :func:`exposition` at ``GET /metrics`` on the pod's progress port,
next to the report itself at ``GET /progress``; both come from the one file local rank 0 writes
(``rtj_trainer.library.progress.EndpointSink``), so the metrics and the job's status never disagree. Names
follow Prometheus conventions: the ``rtj_trainer_`` prefix, base units (seconds, ratios 0-1),
``_total`` on counters. No label is unbounded: the pod's identity comes from the scrape target
(the chart's PodMonitor adds the job and worker labels).

Written by prometheus-client, as the operator's metrics are: a collector of one report's families in a
registry of its own per scrape. The pod runtime copied into a user's image brings prometheus-client
along (``rtj_trainer.runtime.install``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from rtj_contract.times import epoch_seconds

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

# (name, type, help) of every series, in the order they are written.
SERIES: Final = (
    ("rtj_trainer_step", "gauge", "The last completed training step."),
    ("rtj_trainer_loss", "gauge", "Training loss at the last completed step."),
    ("rtj_trainer_step_duration_seconds", "gauge", "Duration of the last completed step."),
    ("rtj_trainer_useful_step_seconds_total", "counter", "Time spent in steps whose work was kept."),
    (
        "rtj_trainer_samples_total",
        "counter",
        "Samples the job trained on up to the last step, as the script reports.",
    ),
    (
        "rtj_trainer_tokens_total",
        "counter",
        "Tokens the job trained on up to the last step, as the script reports.",
    ),
    ("rtj_trainer_samples_per_second", "gauge", "Recent samples per second of useful step time."),
    ("rtj_trainer_tokens_per_second", "gauge", "Recent tokens per second of useful step time."),
    ("rtj_trainer_start_timestamp_seconds", "gauge", "When the job first started training (Unix time)."),
    ("rtj_trainer_goodput_ratio", "gauge", "Useful step time over wall time since training started, 0-1."),
    ("rtj_trainer_checkpoint_last_step", "gauge", "Step of the newest committed checkpoint."),
    (
        "rtj_trainer_checkpoint_last_timestamp_seconds",
        "gauge",
        "When the newest committed checkpoint was committed (Unix time).",
    ),
    ("rtj_trainer_checkpoint_age_seconds", "gauge", "Seconds since the newest checkpoint was committed."),
    (
        "rtj_trainer_checkpoint_save_blocking_seconds",
        "gauge",
        "Time the last checkpoint save blocked training.",
    ),
    ("rtj_trainer_restarts_total", "counter", "Recoveries of this node's training processes, by layer."),
    ("rtj_trainer_finished", "gauge", "1 once training has finished, else 0."),
    ("rtj_trainer_report_timestamp_seconds", "gauge", "When the newest report was made (Unix time)."),
    ("rtj_trainer_report_age_seconds", "gauge", "Seconds since the newest progress report was made."),
)
LAYERS: Final = (("inProcess", "in_process"), ("inJob", "in_job"))
# The label names of the series that have labels.
LABELS: Final = {"rtj_trainer_restarts_total": ("layer",)}


_epoch = epoch_seconds


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def samples(report: Mapping[str, Any], now: float) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Each series' samples (label values in `LABELS`' order, value) from one report; a field absent
    from the report leaves its series without a sample."""
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {name: [] for name, _, _ in SERIES}

    def put(name: str, value: float | None, labels: tuple[str, ...] = ()) -> None:
        if value is not None:
            out[name].append((labels, value))

    at, start = _epoch(report.get("time")), _epoch(report.get("trainStartTime"))
    useful = _number(report.get("usefulStepSeconds"))
    put("rtj_trainer_step", _number(report.get("step")))
    put("rtj_trainer_loss", _number(report.get("loss")))
    put("rtj_trainer_step_duration_seconds", _number(report.get("stepTimeSeconds")))
    put("rtj_trainer_useful_step_seconds_total", useful)
    put("rtj_trainer_samples_total", _number(report.get("samples")))
    put("rtj_trainer_tokens_total", _number(report.get("tokens")))
    put("rtj_trainer_samples_per_second", _number(report.get("samplesPerSecond")))
    put("rtj_trainer_tokens_per_second", _number(report.get("tokensPerSecond")))
    put("rtj_trainer_start_timestamp_seconds", start)
    if useful is not None and at is not None and start is not None and at > start:
        put("rtj_trainer_goodput_ratio", max(0.0, min(1.0, useful / (at - start))))
    checkpoint = report.get("lastCheckpoint")
    if isinstance(checkpoint, Mapping):
        put("rtj_trainer_checkpoint_last_step", _number(checkpoint.get("step")))
        committed = _epoch(checkpoint.get("time"))
        put("rtj_trainer_checkpoint_last_timestamp_seconds", committed)
        put("rtj_trainer_checkpoint_age_seconds", None if committed is None else max(0.0, now - committed))
    put("rtj_trainer_checkpoint_save_blocking_seconds", _number(report.get("checkpointBlockingSeconds")))
    restarts = report.get("restarts")
    if isinstance(restarts, Mapping):
        for key, layer in LAYERS:
            put("rtj_trainer_restarts_total", _number(restarts.get(key)), (layer,))
    put("rtj_trainer_finished", 1.0 if report.get("finished") is True else 0.0)
    put("rtj_trainer_report_timestamp_seconds", at)
    put("rtj_trainer_report_age_seconds", None if at is None else max(0.0, now - at))
    return out


class _ReportCollector(Collector):
    """The families of one report, every series described even without a sample."""

    def __init__(self, report: Mapping[str, Any] | None, now: float) -> None:
        self.values = samples(report, now) if report is not None else {name: [] for name, _, _ in SERIES}

    def collect(self) -> Iterator[Metric]:
        for name, kind, text in SERIES:
            yield self._family(name, kind, text)

    def _family(self, name: str, kind: str, text: str) -> Metric:
        family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        family = family_type(name, text, labels=list(LABELS.get(name, ())))
        for labels, value in self.values[name]:
            family.add_metric(list(labels), value)
        return family


def exposition(report: Mapping[str, Any] | None, now: float) -> str:
    """The text exposition of `report` (None: no report yet, only the series' descriptions)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector(report, now))
    return generate_latest(registry).decode()
