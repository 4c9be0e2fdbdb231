"""Whether training advances: the Stalled condition, and when a recovery ends.

Pods that are Ready say nothing about training: a rank hung in a collective, a launcher stuck in a
rendezvous or a restart that never reaches its first step all leave every pod Running and Ready. What
says whether training advances is the step the trainers report (`progress.fold_progress` records the
current step and when it last rose: `status.progress.currentStep`, `lastAdvanceTime`).

- `watch_stall`: the `Stalled` condition. While every worker is ready, the job is stalled once its
  step has not advanced for `spec.progress.stallAfterSeconds`, counted from the later of the last
  advance and the moment the workers last all became ready (the Ready condition's transition), so
  that starting, and a restart the operator made, count only from when their workers are ready; a
  job with no step at all by then is stalled too. A stall is a Warning Event (`TrainingStalled`) once,
  and a Normal one (`TrainingResumed`) when the step advances again. Suspended, finished or not-ready
  jobs are not stalled. Nothing is restarted: the condition tells people and alerts.
- `recovery_ended` / `end_recovery` / `await_progress`: a recovery (`Recovering`, set when the
  operator counts a fault) ends when every worker is ready AND the step has advanced in a pass that
  sees them ready (by a report made after the fault), not when the pods are ready. A job whose
  trainer has never reported progress has nothing else to go by: its recovery ends when every worker
  is ready. The end is recorded in `status.lastRecovery` (fault time, resume time, duration).

Pure: the pass state in, conditions, Events and status out; time is the pass's `now`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from rtj_operator import events
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.state import PassState
from rtj_operator.progress import format_time, parse_time


def stall_deadline(
    last_advance: datetime | None, ready_since: datetime | None, stall_after_seconds: int
) -> datetime | None:
    """When the job counts as stalled unless its step advances first: `stall_after_seconds` after the
    later of the last advance and when every worker became ready; None while they are not all ready."""
    if ready_since is None:
        return None
    start = max(ready_since, last_advance) if last_advance is not None else ready_since
    return start + timedelta(seconds=stall_after_seconds)


def recovery_resumed(
    *,
    reports_progress: bool,
    advanced: bool,
    advance_report_time: datetime | None,
    recovery_start: datetime | None,
) -> bool:
    """Whether a recovery whose workers are all ready has ended: the step advanced in this pass, by a
    report made after the recovery began (a report made before the fault but read after it is not
    training resumed). Without any progress report ever, readiness is all there is to go by."""
    if not reports_progress:
        return True
    if not advanced:
        return False
    if advance_report_time is None or recovery_start is None:
        return True
    return advance_report_time >= recovery_start


def _condition(run: PassState, type_: str) -> dict[str, Any] | None:
    return next((c for c in run.conditions if c.get("type") == type_), None)


def _ready_since(run: PassState) -> datetime | None:
    """When every worker last became ready, if they all are now."""
    ready = _condition(run, events.COND_READY)
    if ready is None or ready.get("status") != "True":
        return None
    return parse_time(ready.get("lastTransitionTime")) or run.now


def _current_step(run: PassState) -> int | None:
    step = (run.progress or {}).get("currentStep", (run.progress or {}).get("step"))
    return step if isinstance(step, int) else None


def _advanced(run: PassState) -> bool:
    return run.folded is not None and run.folded.advanced


# -- Stalled --


def watch_stall(run: PassState) -> None:
    """Set the Stalled condition for this pass, post its Events, and ask to look again at the deadline."""
    if cond.finished(run.conditions):
        _not_stalled(run, events.REASON_FINISHED, "the job finished")
        return
    if run.job.suspend:
        _not_stalled(run, events.SUSPENDED, "the job is suspended")
        return
    ready_since = _ready_since(run)
    limit = run.job.model.spec.progress.stall_after_seconds
    last_advance = parse_time((run.progress or {}).get("lastAdvanceTime"))
    deadline = stall_deadline(last_advance, ready_since, limit)
    if ready_since is None or deadline is None:
        _not_stalled(run, events.REASON_WORKERS_NOT_READY, "not every worker is ready")
        return
    stalled = cond.condition_true(run.conditions, events.COND_STALLED)
    if run.now >= deadline:
        if not stalled:
            message = _stall_message(run, last_advance, ready_since, limit)
            run.condition(events.COND_STALLED, True, events.REASON_NO_PROGRESS, message)
            run.event(events.WARNING, events.TRAINING_STALLED, message)
        return
    run.at(deadline)
    if stalled and _advanced(run):
        message = f"training advanced to step {_current_step(run)}"
        run.condition(events.COND_STALLED, False, events.TRAINING_RESUMED, message)
        run.event(events.NORMAL, events.TRAINING_RESUMED, message)
    elif stalled:  # stallAfterSeconds was raised past the time without a step
        _not_stalled(run, events.REASON_NOT_STALLED, f"spec.progress.stallAfterSeconds is now {limit}")
    elif (_condition(run, events.COND_STALLED) or {}).get("reason") != events.TRAINING_RESUMED:
        _not_stalled(run, events.REASON_NOT_STALLED, "training has not stalled")


def _not_stalled(run: PassState, reason: str, message: str) -> None:
    """Stalled=False with why (an unchanged condition is not rewritten)."""
    run.condition(events.COND_STALLED, False, reason, message)


def _stall_message(run: PassState, last_advance: datetime | None, ready_since: datetime, limit: int) -> str:
    step = _current_step(run)
    setting = f"(spec.progress.stallAfterSeconds: {limit})"
    if last_advance is not None and last_advance >= ready_since:
        seconds = round((run.now - last_advance).total_seconds())
        return f"training has not advanced past step {step} for {seconds} s {setting}"
    seconds = round((run.now - ready_since).total_seconds())
    if step is None:
        return f"no training step reported in the {seconds} s since every worker became ready {setting}"
    return (
        f"training has not advanced past step {step} in the {seconds} s since every worker became ready "
        f"{setting}"
    )


# -- the end of a recovery --


def recovery_ended(run: PassState) -> bool:
    """Whether the recovery in progress (Recovering=True, every worker ready) has ended this pass."""
    recovering = _condition(run, events.COND_RECOVERING) or {}
    return recovery_resumed(
        reports_progress=run.progress is not None,
        advanced=_advanced(run),
        advance_report_time=run.folded.advance_report_time if run.folded is not None else None,
        recovery_start=parse_time(recovering.get("lastTransitionTime")),
    )


def end_recovery(run: PassState) -> None:
    """Recovering=False (JobRecovered, with an Event), and the recovery recorded in status.lastRecovery."""
    recovering = dict(_condition(run, events.COND_RECOVERING) or {})  # a copy: the condition changes below
    started = parse_time(recovering.get("lastTransitionTime"))
    nodes = run.job.nodes
    step = _current_step(run)
    seconds = round((run.now - started).total_seconds(), 1) if started is not None else None
    after = f" {seconds:.0f} s after the fault" if seconds is not None else ""
    if run.progress is None:
        message = f"all {nodes} workers are ready again{after}"
    else:
        message = f"training advanced to step {step}{after}; all {nodes} workers are ready"
    run.event(events.NORMAL, events.JOB_RECOVERED, message)
    run.condition(events.COND_RECOVERING, False, events.JOB_RECOVERED, message)
    # Every field, None when unknown: status is a merge patch, where only null removes a field.
    run.last_recovery = {
        "reason": recovering.get("reason") or None,
        "faultTime": format_time(started) if started is not None else None,
        "resumeTime": format_time(run.now),
        "durationSeconds": seconds,
        "step": step,
    }


def await_progress(run: PassState) -> None:
    """Every worker is ready but training has not advanced yet: Recovering stays, and says so."""
    recovering = _condition(run, events.COND_RECOVERING) or {}
    step = _current_step(run)
    waiting = f"past step {step}" if step is not None else "to its first step"
    message = f"all {run.job.nodes} workers are ready; waiting for training to advance {waiting}"
    if recovering.get("message") != message:
        reason = str(recovering.get("reason") or events.REASON_RECOVERING)
        run.condition(events.COND_RECOVERING, True, reason, message)
