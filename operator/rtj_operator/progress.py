"""Fold the trainer's progress reports into the job's status; the goodput arithmetic.

The trainer on each worker pod serves its newest JSON progress report on the pod's progress endpoint
(the progress contract in docs/architecture.md). `runtime.scrape` reads it and parses it with
`parse_report`; `observe` hands each pod its report; `decide.reconcile` calls `fold_progress` to turn the
reports of the current pods into `status.progress`, `status.lastCheckpoint` and the in-process / in-job
restart counters.

A report is the rtj library's (rtj-train), or rtj-launch's own view of the ranks it runs (a script of
one's own), or both merged; its `sources` say which figure comes from where
(`api.status.StepSource`, `api.status.RestartsSource`), `ranks` what rtj-launch sees of the ranks
and `library` the library's version.
A report without `sources` is the library's, from before rtj-launch added them: its step counts.
A report whose step is `NotReported` has none: it feeds the restart counts, never the step.
A report of library 0.2.0 or later may carry the script's `samples` and `tokens` (the job's, not one
rank's: docs/library.md, "Samples and tokens") and their recent rates; they come from the lead
report as the step does.

Everything here is pure: same inputs, same outputs; time is passed in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from rtj_contract import progress as progress_contract
from rtj_contract.times import format_rfc3339, parse_rfc3339

from rtj_operator.api.status import RestartsSource, StepSource

# A version string of the library is kept this short (status.progress.library).
MAX_LIBRARY_VERSION_CHARS = 64


# A node fault's reason is shown in messages and status: kept this short.
MAX_NODE_FAULT_REASON_CHARS = 256


@dataclass(frozen=True)
class NodeFaultReport:
    """The report's `nodeFaults`: faults the trainer attributes to the node it runs on (CUDA errors,
    failed GPU health checks), counted across the node's in-process and in-job restarts."""

    node: str  # the node the faults happened on (a report carried over from another node is ignored)
    count: int
    last_reason: str


@dataclass(frozen=True)
class RanksReport:
    """The report's `ranks`: what rtj-launch sees of the training processes it runs."""

    running: int  # ranks without an exit record
    start_time: datetime | None  # the newest generation's earliest start
    restart_count: int  # the highest TORCHELASTIC_RESTART_COUNT seen


@dataclass(frozen=True)
class RecoveryReport:
    """The newest entry of the report's `events`: a restart and when training came back after it."""

    kind: str  # InJobRestart or InProcessRestart
    time: datetime  # when the ranks were back (the first step, or the generation's start)
    fault_time: datetime | None
    recovery_seconds: float | None
    step: int | None


@dataclass(frozen=True)
class ProgressReport:
    """One pod's progress report, validated field by field (a bad field reads as absent)."""

    time: datetime | None
    node_rank: int | None
    step: int
    checkpoint_step: int | None
    checkpoint_time: str | None
    in_process_restarts: int
    in_job_restarts: int
    step_time_seconds: float | None
    useful_step_seconds: float | None
    train_start_time: datetime | None
    finished: bool
    node_faults: NodeFaultReport | None = None
    # How long the newest checkpoint save blocked training (0 or None before the first save).
    checkpoint_blocking_seconds: float | None = None
    # sources.step / sources.restarts; None: the report does not say (the library's, before sources).
    step_source: StepSource | None = None
    restarts_source: RestartsSource | None = None
    # Whether `step` is a step the report gives (False: NotReported, or a log pattern that matched nothing).
    has_step: bool = True
    library: str | None = None  # the rtj library's version, when the library reports
    ranks: RanksReport | None = None
    last_recovery: RecoveryReport | None = None  # the newest of `events`
    # The job's samples and tokens trained on so far and per second of recent useful step time, as
    # the script reports them through the library (None: not reported).
    samples: int | None = None
    tokens: int | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None

    @property
    def reports_steps(self) -> bool:
        """Whether the job's step is known from this pod: the library's or a log pattern's (even one
        that has matched nothing yet), not NotReported."""
        return self.step_source is not StepSource.NOT_REPORTED


def _int(value: object, default: int = 0) -> int:
    # bool is an int subclass; a report saying `"step": true` is malformed, not step 1.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _float(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def parse_node_faults(value: object) -> NodeFaultReport | None:
    """`nodeFaults: {"node": str, "count": int, "lastReason": str}`; None when absent or malformed."""
    if not isinstance(value, dict):
        return None
    node, count, reason = value.get("node"), value.get("count"), value.get("lastReason")
    if not isinstance(node, str) or not node or _int(count, -1) < 0:
        return None
    reason = reason[:MAX_NODE_FAULT_REASON_CHARS] if isinstance(reason, str) else ""
    return NodeFaultReport(node=node, count=_int(count), last_reason=reason)


def _step_source(value: object) -> StepSource | None:
    return StepSource(value) if isinstance(value, str) and value in set(StepSource) else None


def _restarts_source(value: object) -> RestartsSource | None:
    return RestartsSource(value) if isinstance(value, str) and value in set(RestartsSource) else None


def parse_ranks(value: object) -> RanksReport | None:
    """`ranks: {"running": int, "startTime": RFC 3339 or null, "restartCount": int}`; None when absent or
    malformed."""
    if not isinstance(value, dict) or _int(value.get("running"), -1) < 0:
        return None
    return RanksReport(
        running=_int(value.get("running")),
        start_time=parse_rfc3339(value.get("startTime")),
        restart_count=_int(value.get("restartCount")),
    )


def parse_last_recovery(value: object) -> RecoveryReport | None:
    """The newest well-formed entry of `events` (by its `time`), or None."""
    found: list[RecoveryReport] = []
    for event in value if isinstance(value, list) else []:
        if not isinstance(event, dict):
            continue
        kind, time = event.get("kind"), parse_rfc3339(event.get("time"))
        if not isinstance(kind, str) or not kind.isalnum() or time is None:
            continue
        step = event.get("step")
        found.append(
            RecoveryReport(
                kind=kind,
                time=time,
                fault_time=parse_rfc3339(event.get("faultTime")),
                recovery_seconds=_float(event.get("recoverySeconds")),
                step=_int(step) if _int(step, -1) >= 0 else None,
            )
        )
    return max(found, key=lambda r: r.time) if found else None


def _library(value: object) -> str | None:
    return value[:MAX_LIBRARY_VERSION_CHARS] if isinstance(value, str) and value.strip() else None


def parse_report(text: str | None) -> ProgressReport | None:
    """Parse a progress report; None when there is none or it is not a JSON object of version 1.

    The report is written by a program in the user's image, so nothing in it is trusted: a
    malformed report must never stop the job's reconciliation.
    """
    if not text:
        return None
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return None
    version = progress_contract.SCHEMA_VERSION
    if not isinstance(raw, dict) or raw.get("v", version) != version:
        return None
    checkpoint = raw.get("lastCheckpoint")
    checkpoint = checkpoint if isinstance(checkpoint, dict) else {}
    restarts = raw.get("restarts")
    restarts = restarts if isinstance(restarts, dict) else {}
    checkpoint_step = checkpoint.get("step")
    checkpoint_time = parse_rfc3339(checkpoint.get("time"))
    node_rank = raw.get("nodeRank")
    sources = raw.get("sources")
    sources = sources if isinstance(sources, dict) else {}
    step_source = _step_source(sources.get("step"))
    given_step = _int(raw.get("step"), -1) >= 0
    return ProgressReport(
        time=parse_rfc3339(raw.get("time")),
        node_rank=_int(node_rank) if isinstance(node_rank, int) and not isinstance(node_rank, bool) else None,
        step=_int(raw.get("step")),
        checkpoint_step=_int(checkpoint_step) if _int(checkpoint_step, -1) >= 0 else None,
        checkpoint_time=format_rfc3339(checkpoint_time) if checkpoint_time else None,
        in_process_restarts=_int(restarts.get("inProcess")),
        in_job_restarts=_int(restarts.get("inJob")),
        step_time_seconds=_float(raw.get("stepTimeSeconds")),
        useful_step_seconds=_float(raw.get("usefulStepSeconds")),
        train_start_time=parse_rfc3339(raw.get("trainStartTime")),
        finished=raw.get("finished") is True,
        node_faults=parse_node_faults(raw.get("nodeFaults")),
        checkpoint_blocking_seconds=_float(raw.get("checkpointBlockingSeconds")),
        step_source=step_source,
        restarts_source=_restarts_source(sources.get("restarts")),
        has_step=step_source is None or (step_source is not StepSource.NOT_REPORTED and given_step),
        library=_library(raw.get("library")),
        ranks=parse_ranks(raw.get("ranks")),
        last_recovery=parse_last_recovery(raw.get("events")),
        samples=_count_or_none(raw.get("samples")),
        tokens=_count_or_none(raw.get("tokens")),
        samples_per_second=_float(raw.get("samplesPerSecond")),
        tokens_per_second=_float(raw.get("tokensPerSecond")),
    )


def _count_or_none(value: object) -> int | None:
    return _int(value) if _int(value, -1) >= 0 else None


def goodput_percent(
    useful_step_seconds: float | None, train_start: datetime | None, at: datetime | None
) -> float | None:
    """Training goodput: useful step time over wall time since training started, in percent.

    The same definition as the AWS NVRx sample (training_goodput = useful step time / wall time).
    `at` is the report's own time rather than the operator's clock, so that an idle job's status does
    not change (and is not rewritten) every time the operator looks at it. Rounded to 0.1, clamped to
    [0, 100]; None when it cannot be computed.
    """
    if useful_step_seconds is None or train_start is None or at is None:
        return None
    wall = (at - train_start).total_seconds()
    if wall <= 0:
        return None
    return round(max(0.0, min(100.0, 100.0 * useful_step_seconds / wall)), 1)


@dataclass(frozen=True)
class RestartOffset:
    """What the job had counted before a pod's own counters started (pods count from 0 when created)."""

    in_process: int
    in_job: int


@dataclass(frozen=True)
class FoldedProgress:
    """The status fields computed from the reports, and the offsets to remember for the next fold."""

    progress: dict[str, Any] | None
    last_checkpoint: dict[str, Any] | None
    in_process_restarts: int
    in_job_restarts: int
    offsets: dict[str, RestartOffset]
    # Whether this fold saw training complete a step (`currentStep` increased), and the time of the
    # report that showed it (the trainer's clock; None when the report has none).
    advanced: bool = False
    advance_report_time: datetime | None = None
    # The most any current worker's newest save blocked training, None when no report has one.
    save_cost_seconds: float | None = None
    # Wall time from the job's first training start to the lead report, None without both times.
    training_seconds: float | None = None
    reported: bool = False  # whether any report was folded


def fold_progress(
    status: Mapping[str, Any],
    reports: Sequence[tuple[str, ProgressReport]],
    offsets: Mapping[str, RestartOffset],
    now: datetime | None = None,
    leaving: Collection[str] = (),
) -> FoldedProgress:
    """Fold the current pods' reports (keyed by pod uid) into the status fields they feed.

    - step: the highest step any pod reports; step time, goodput, samples and tokens (and their
      rates) come from that pod's report (the most advanced view of the job), never going backwards
      in `updateTime` terms.
    - lastCheckpoint: the newest (highest step) committed checkpoint in any report or in status.
    - restarts: in-process and in-job restarts are job-wide events (every rank restarts), so the job's
      count is the maximum over pods, not the sum. A replaced pod counts from 0 again, so each pod is
      given an offset, the job's count when the pod was first seen; the job's count is then
      max(previous count, max over pods of offset + the pod's count): never decreasing, and counting
      restarts that happened after a replacement. A pod first seen by a freshly started operator
      (offsets are memory, the counts are status) gets the offset that makes it add nothing yet.
    - currentStep and lastAdvanceTime (`track_advance`): the most advanced pod's step among those
      not `leaving` (pods being deleted: their last report is not where training is now), which may
      fall below `step` after a restart from a checkpoint; training advanced when it rose, at `now`
      (the operator's clock, so that a trainer's skewed clock cannot fake or hide a stall).
    - Only reports that give a step (`ProgressReport.has_step`) feed the step; the others feed the
      restarts. `sources` and `library` (`note_sources`) say where the figures come from.
    """
    best_in_process, best_in_job, new_offsets = _fold_restarts(status, reports, offsets)
    old_progress = status.get("progress")
    progress: dict[str, Any] | None = dict(old_progress) if isinstance(old_progress, dict) else None
    stepped = [r for r in reports if r[1].has_step]
    advanced, lead, current = False, _lead(stepped), _lead([r for r in stepped if r[0] not in leaving])
    if lead is not None:
        old = progress or {}
        progress = _lead_progress(lead) if lead.step >= _int(old.get("step"), -1) else dict(old)
        if current is not None:
            checkpoint = _dict_or_empty(status.get("lastCheckpoint")).get("step")
            saved = checkpoint if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) else None
            advanced = track_advance(progress, old, current.step, now or current.time, saved)
    costs = [r.checkpoint_blocking_seconds for _, r in reports if r.checkpoint_blocking_seconds]
    training = None
    if lead is not None and lead.time is not None and lead.train_start_time is not None:
        training = max(0.0, (lead.time - lead.train_start_time).total_seconds())
    return FoldedProgress(
        progress=_note_sources(progress, _dict_or_empty(old_progress), [r for _, r in reports]),
        last_checkpoint=_fold_checkpoint(status, reports),
        in_process_restarts=best_in_process,
        in_job_restarts=best_in_job,
        offsets=new_offsets,
        advanced=advanced,
        advance_report_time=current.time if advanced and current is not None else None,
        save_cost_seconds=max(costs) if costs else None,
        training_seconds=training,
        reported=bool(reports),
    )


def _dict_or_empty(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# The most telling source first: any worker whose library reports makes the job's step the library's.
_STEP_SOURCES = (StepSource.LIBRARY, StepSource.LOG_PATTERN, StepSource.NOT_REPORTED)
_RESTARTS_SOURCES = (RestartsSource.LIBRARY, RestartsSource.LAUNCHER)
_Source = TypeVar("_Source", StepSource, RestartsSource)


def _most_telling(order: Sequence[_Source], seen: Collection[object]) -> _Source | None:
    return next((source for source in order if source in seen), None)


def _note_sources(
    progress: dict[str, Any] | None, old: Mapping[str, Any], reports: Sequence[ProgressReport]
) -> dict[str, Any] | None:
    """`progress` with `sources` ({step, restarts}: the most telling source any report names) and
    `library` (a report's library version); what no report says is kept from `old`."""
    sources = dict(_dict_or_empty(old.get("sources")))
    step = _most_telling(_STEP_SOURCES, {r.step_source for r in reports})
    restarts = _most_telling(_RESTARTS_SOURCES, {r.restarts_source for r in reports})
    if step is not None:
        sources["step"] = step.value
    if restarts is not None:
        sources["restarts"] = restarts.value
    library = next((r.library for r in reports if r.library), old.get("library"))
    if not sources and library is None:
        return progress
    noted = dict(progress or {})
    if sources:
        noted["sources"] = sources
    if library is not None:
        noted["library"] = library
    return noted


def _lead(reports: Sequence[tuple[str, ProgressReport]]) -> ProgressReport | None:
    """The most advanced pod's report; ties go to the newest report so the step time is fresh."""
    if not reports:
        return None
    _, lead = max(reports, key=lambda item: (item[1].step, item[1].time or datetime.min.replace(tzinfo=UTC)))
    return lead


def _fold_restarts(
    status: Mapping[str, Any],
    reports: Sequence[tuple[str, ProgressReport]],
    offsets: Mapping[str, RestartOffset],
) -> tuple[int, int, dict[str, RestartOffset]]:
    """(in-process restarts, in-job restarts, offsets by pod uid): see `fold_progress`."""
    old_restarts = status.get("restarts") or {}
    in_process_total = _int(old_restarts.get("inProcess"))
    in_job_total = _int(old_restarts.get("inJob"))
    new_offsets: dict[str, RestartOffset] = {}
    best_in_process, best_in_job = in_process_total, in_job_total
    for uid, report in reports:
        offset = offsets.get(uid) or RestartOffset(
            in_process=max(0, in_process_total - report.in_process_restarts),
            in_job=max(0, in_job_total - report.in_job_restarts),
        )
        new_offsets[uid] = offset
        best_in_process = max(best_in_process, offset.in_process + report.in_process_restarts)
        best_in_job = max(best_in_job, offset.in_job + report.in_job_restarts)
    return best_in_process, best_in_job, new_offsets


def _lead_progress(lead: ProgressReport) -> dict[str, Any]:
    """status.progress from the most advanced pod's report."""
    progress: dict[str, Any] = {"step": lead.step}
    if lead.step_time_seconds is not None:
        progress["stepTimeSeconds"] = round(lead.step_time_seconds, 4)
    goodput = goodput_percent(lead.useful_step_seconds, lead.train_start_time, lead.time)
    if goodput is not None:
        progress["goodputPercent"] = goodput
    if lead.time is not None:
        progress["updateTime"] = format_rfc3339(lead.time)
    return progress | _work_progress(lead)


def _work_progress(lead: ProgressReport) -> dict[str, Any]:
    """`samples`, `tokens`, `samplesPerSecond`, `tokensPerSecond`: those the lead report gives. Each
    report counts the whole job's work (the library's contract), so the lead's is the job's: a sum
    over pods would count it once per node."""
    rates = {"samplesPerSecond": lead.samples_per_second, "tokensPerSecond": lead.tokens_per_second}
    work: dict[str, Any] = {"samples": lead.samples, "tokens": lead.tokens}
    work |= {field: round(rate, 2) for field, rate in rates.items() if rate is not None}
    return {field: value for field, value in work.items() if value is not None}


def _fold_checkpoint(
    status: Mapping[str, Any], reports: Sequence[tuple[str, ProgressReport]]
) -> dict[str, Any] | None:
    """The newest (highest step) committed checkpoint in any report or in status."""
    old_checkpoint = status.get("lastCheckpoint")
    checkpoint: dict[str, Any] | None = dict(old_checkpoint) if isinstance(old_checkpoint, dict) else None
    for _, report in reports:
        if report.checkpoint_step is None:
            continue
        if checkpoint is None or report.checkpoint_step > _int(checkpoint.get("step"), -1):
            checkpoint = {"step": report.checkpoint_step}
            if report.checkpoint_time:
                checkpoint["time"] = report.checkpoint_time
    return checkpoint


def track_advance(
    progress: dict[str, Any],
    old: Mapping[str, Any],
    step: int,
    at: datetime | None,
    checkpoint_step: int | None = None,
) -> bool:
    """Record the lead pod's `step` as `currentStep` in `progress`; True when training advanced.

    Training advanced when the step rose above the previous `currentStep` (or, in a status without
    one, above `step`; with neither, above 0: the first step). A step that fell (a restart resumed
    from an older checkpoint) is an advance when it is above `checkpoint_step`, the newest committed
    checkpoint before this report (a trainer reports a step once it completed it, so a restarted one
    above its checkpoint has trained); otherwise it is only the new base, and the steps redone from
    there are advances again. `lastAdvanceTime` moves to `at` on an advance and is otherwise kept.
    """
    previous = _int(old.get("currentStep"), -1)
    if previous < 0:
        previous = _int(old.get("step"), 0)
    advanced = step > previous or (step < previous and checkpoint_step is not None and step > checkpoint_step)
    progress["currentStep"] = step
    last = old.get("lastAdvanceTime")
    if advanced and at is not None:
        progress["lastAdvanceTime"] = format_rfc3339(at)
    elif isinstance(last, str):
        progress["lastAdvanceTime"] = last
    return advanced
