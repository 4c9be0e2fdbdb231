"""The trainer's Prometheus metrics, rendered from its newest progress report (pure).

``rtj_trainer.endpoint`` serves :func:`exposition` at ``GET /metrics`` on the pod's progress port,
next to the report itself at ``GET /progress``; both come from the one file local rank 0 writes
(``rtj_trainer.progress.EndpointSink``), so the metrics and the job's status never disagree. Names
follow Prometheus conventions: the ``rtj_trainer_`` prefix, base units (seconds, ratios 0-1),
``_total`` on counters. No label is unbounded: the pod's identity comes from the scrape target
(the chart's PodMonitor adds the job and worker labels).

Text exposition format 0.0.4, written by hand so that the trainer image needs nothing beyond the
standard library for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help) of every series, in the order they are written.
SERIES: Final = (
    ("rtj_trainer_step", "gauge", "The last completed training step."),
    ("rtj_trainer_loss", "gauge", "Training loss at the last completed step."),
    ("rtj_trainer_step_duration_seconds", "gauge", "Duration of the last completed step."),
    ("rtj_trainer_useful_step_seconds_total", "counter", "Time spent in steps whose work was kept."),
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


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _format(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def samples(report: Mapping[str, Any], now: float) -> dict[str, list[tuple[str, float]]]:
    """Each series' samples (`label text`, value) from one report; a field absent from the report
    leaves its series without a sample."""
    out: dict[str, list[tuple[str, float]]] = {name: [] for name, _, _ in SERIES}

    def put(name: str, value: float | None, labels: str = "") -> None:
        if value is not None:
            out[name].append((labels, value))

    at, start = _epoch(report.get("time")), _epoch(report.get("trainStartTime"))
    useful = _number(report.get("usefulStepSeconds"))
    put("rtj_trainer_step", _number(report.get("step")))
    put("rtj_trainer_loss", _number(report.get("loss")))
    put("rtj_trainer_step_duration_seconds", _number(report.get("stepTimeSeconds")))
    put("rtj_trainer_useful_step_seconds_total", useful)
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
            put("rtj_trainer_restarts_total", _number(restarts.get(key)), f'layer="{layer}"')
    put("rtj_trainer_finished", 1.0 if report.get("finished") is True else 0.0)
    put("rtj_trainer_report_timestamp_seconds", at)
    put("rtj_trainer_report_age_seconds", None if at is None else max(0.0, now - at))
    return out


def exposition(report: Mapping[str, Any] | None, now: float) -> str:
    """The text exposition of `report` (None: no report yet, only the series' descriptions)."""
    values = samples(report or {}, now) if report is not None else {name: [] for name, _, _ in SERIES}
    lines: list[str] = []
    for name, kind, text in SERIES:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, value in values[name]:
            lines.append(f"{name}{{{labels}}} {_format(value)}" if labels else f"{name} {_format(value)}")
    return "\n".join(lines) + "\n"
