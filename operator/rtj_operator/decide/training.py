"""Whether training advances: the Stalled condition, and when a recovery ends.

Pods that are Ready say nothing about training: a rank hung in a collective, a launcher stuck in a
rendezvous or a restart that never reaches its first step all leave every pod Running and Ready. What
says whether training advances is the step the trainers report (`progress.fold_progress` records the
current step and when it last rose: `status.progress.currentStep`, `lastAdvanceTime`).

Where the step comes from (`status.progress.sources.step`): the rtj library's reports, or lines of a
script's own output that `spec.progress.stepLogPattern` matched; neither (`NotReported`) for a script
of one's own without a pattern. Steps are *reported* (`steps_reported`) when a worker's report gives
them (even a pattern that has matched nothing yet) or the job reported a step before; they are
*expected* (`steps_expected`) also when the spec declares a pattern or the job runs the library's own
program (rtj-train), whose first report comes with its first step.

- `watch_stall`: the `Stalled` condition. While every worker is ready, the job is stalled once its
  step has not advanced for `spec.progress.stallAfterSeconds`, counted from the later of the last
  advance and the moment the workers last all became ready (the Ready condition's transition), so
  that starting, and a restart the operator made, count only from when their workers are ready; a
  job with no step at all by then is stalled too. A stall is a Warning Event (`TrainingStalled`) once,
  and a Normal one (`TrainingResumed`) when the step advances again. Suspended, finished or not-ready
  jobs are not stalled. A job whose steps are not expected cannot be judged: `Stalled=Unknown`
  (`StepsNotReported`), its message saying how to get steps. Nothing is restarted: the condition
  tells people and alerts.
- `recovery_ended` / `end_recovery` / `await_progress`: a recovery (`Recovering`, set when the
  operator counts a fault) ends when every worker is ready AND the step has advanced in a pass that
  sees them ready (by a report made after the fault), not when the pods are ready. A job that reports
  no step ends it when every worker's report shows its ranks running, started at or after the
  recovery began (`ranks_back`: the ranks' start is the resume time), once its workers report ranks
  (`ranks_reported`). A job whose workers never reported anything has nothing else to go by: its
  recovery ends when every worker is ready. The end is recorded in `status.lastRecovery` (fault time,
  resume time, duration).
- `note_advance`: a step, or a recovery that ended on the ranks, shows training got going: every
  worker's series of failed starts ends (`decide.startup`).
- `note_launcher_restart`: for a job whose restarts rtj-launch counts (no library), the newest in-job
  restart it timed (from the ranks' fault to their next step or start) is `status.lastRecovery` too,
  unless the operator is recovering the job or recorded a recovery that ended after that fault.

Pure: the pass state in, conditions, Events and status out; time is the pass's `now`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rtj_contract.times import format_rfc3339, parse_rfc3339

from rtj_operator import events
from rtj_operator.api.status import Condition, ConditionStatus, ProgressStatus, RecoveryStatus, RestartsSource
from rtj_operator.decide import conditions as cond
from rtj_operator.decide import library, startup
from rtj_operator.decide.state import WORKER, PassState
from rtj_operator.progress import ProgressReport, RecoveryReport


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


def _condition(run: PassState, type_: str) -> Condition:
    """The condition of `type_`, or an empty one (no status, reason or time) while there is none."""
    return cond.find(run.conditions, type_) or Condition(type=type_, status=ConditionStatus.UNKNOWN)


def ready_since(run: PassState) -> datetime | None:
    """When every worker last became ready, if they all are now."""
    return cond.ready_since(run.conditions, run.now)


def _current_step(run: PassState) -> int | None:
    if run.progress is None:
        return None
    return run.progress.current_step if run.progress.current_step is not None else run.progress.step


def _advanced(run: PassState) -> bool:
    return run.folded is not None and run.folded.advanced


def _reports(run: PassState) -> list[ProgressReport]:
    """The current pods' reports (workers', and the Supervisor spares' whose ranks may have taken over)."""
    return [pod.report for _, pod in sorted(run.pods.items()) if pod.report is not None]


def steps_reported(run: PassState) -> bool:
    """Whether a worker reports the job's step (the library's, or a pattern's even before its first
    match), or the job reported a step before."""
    progress = run.progress or ProgressStatus()
    return (
        any(r.reports_steps for r in _reports(run))
        or progress.current_step is not None
        or progress.step is not None
    )


def steps_expected(run: PassState) -> bool:
    """Whether the job's step is, or will be, known: reported, a pattern declared, or rtj-train."""
    spec = run.job.model.spec
    return (
        steps_reported(run)
        or spec.progress.step_log_pattern is not None
        or library.runs_library_program(spec)
    )


def ranks_back(run: PassState, since: datetime | None) -> datetime | None:
    """When the ranks of every worker were running again, started at or after `since` (the latest
    start); None while a worker's report does not show that."""
    starts = []
    for index in range(run.job.nodes):
        pod = run.pod(WORKER, index)
        ranks = pod.report.ranks if pod is not None and pod.report is not None else None
        if ranks is None or ranks.running <= 0 or ranks.start_time is None:
            return None
        if since is not None and ranks.start_time < since:
            return None
        starts.append(ranks.start_time)
    return max(starts, default=None)


def ranks_reported(run: PassState) -> bool:
    """Whether the workers report their ranks: a report shows them, or the workers reported `sources`
    before (rtj-launch's view of the ranks always comes with them), so a new pod's first report is
    awaited rather than its readiness taken for training."""
    return any(r.ranks is not None for r in _reports(run)) or (
        run.progress is not None and run.progress.sources is not None
    )


def note_advance(run: PassState) -> None:
    """Training advanced this pass: the workers' earlier failed starts are history (`decide.startup`)."""
    if _advanced(run):
        startup.forget_start_failures(run)


# -- Stalled --


def watch_stall(run: PassState) -> None:
    """Set the Stalled condition for this pass, post its Events, and ask to look again at the deadline."""
    if cond.finished(run.conditions):
        _not_stalled(run, cond.REASON_FINISHED, "the job finished")
        return
    if run.job.suspend:
        _not_stalled(run, events.SUSPENDED, "the job is suspended")
        return
    ready = ready_since(run)
    limit = run.job.model.spec.progress.stall_after_seconds
    last_advance = parse_rfc3339(run.progress.last_advance_time if run.progress is not None else None)
    deadline = stall_deadline(last_advance, ready, limit)
    if ready is None or deadline is None:
        _not_stalled(run, cond.REASON_WORKERS_NOT_READY, "not every worker is ready")
        return
    if not steps_expected(run):
        message = _steps_not_reported_message(run)
        run.condition(cond.COND_STALLED, ConditionStatus.UNKNOWN, cond.REASON_STEPS_NOT_REPORTED, message)
        return
    stalled = cond.condition_true(run.conditions, cond.COND_STALLED)
    if run.now >= deadline:
        if not stalled:
            message = _stall_message(run, last_advance, ready, limit)
            run.condition(cond.COND_STALLED, True, cond.REASON_NO_PROGRESS, message)
            run.event(events.WARNING, events.TRAINING_STALLED, message)
        return
    run.at(deadline)
    if stalled and _advanced(run):
        message = f"training advanced to step {_current_step(run)}"
        run.condition(cond.COND_STALLED, False, events.TRAINING_RESUMED, message)
        run.event(events.NORMAL, events.TRAINING_RESUMED, message)
    elif stalled:  # stallAfterSeconds was raised past the time without a step
        _not_stalled(run, cond.REASON_NOT_STALLED, f"spec.progress.stallAfterSeconds is now {limit}")
    elif _condition(run, cond.COND_STALLED).reason != events.TRAINING_RESUMED:
        _not_stalled(run, cond.REASON_NOT_STALLED, "training has not stalled")


def _not_stalled(run: PassState, reason: str, message: str) -> None:
    """Stalled=False with why (an unchanged condition is not rewritten)."""
    run.condition(cond.COND_STALLED, False, reason, message)


def _steps_not_reported_message(run: PassState) -> str:
    """Why a stall cannot be told, and how to get steps."""
    said = "the workers report no training step" if _reports(run) else "no worker has reported progress yet"
    return (
        f"{said}, so a stall cannot be told: have the training script use the rtj library (as rtj-train "
        "does), or set spec.progress.stepLogPattern to a regular expression that matches the step in the "
        "lines the script prints"
    )


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
    recovering = _condition(run, cond.COND_RECOVERING)
    started = parse_rfc3339(recovering.last_transition_time)
    reported = steps_reported(run)
    if not reported and ranks_reported(run):
        return ranks_back(run, started) is not None
    return recovery_resumed(
        reports_progress=reported,
        advanced=_advanced(run),
        advance_report_time=run.folded.advance_report_time if run.folded is not None else None,
        recovery_start=started,
    )


def end_recovery(run: PassState) -> None:
    """Recovering=False (JobRecovered, with an Event), and the recovery recorded in status.lastRecovery."""
    recovering = _condition(run, cond.COND_RECOVERING).model_copy()  # the condition changes below
    started = parse_rfc3339(recovering.last_transition_time)
    nodes = run.job.nodes
    step = _current_step(run)
    reported = steps_reported(run)
    ranks_at = None if reported else ranks_back(run, started)
    resumed = ranks_at or run.now
    seconds = max(0.0, round((resumed - started).total_seconds(), 1)) if started is not None else None
    after = f" {seconds:.0f} s after the fault" if seconds is not None else ""
    if ranks_at is not None:
        message = f"the ranks of all {nodes} workers are running again{after}"
    elif not reported:
        message = f"all {nodes} workers are ready again{after}"
    else:
        message = f"training advanced to step {step}{after}; all {nodes} workers are ready"
    run.event(events.NORMAL, events.JOB_RECOVERED, message)
    run.condition(cond.COND_RECOVERING, False, events.JOB_RECOVERED, message)
    if ranks_at is not None:
        startup.forget_start_failures(run)  # training got going (a step does so in `note_advance`)
    run.last_recovery = RecoveryStatus(
        reason=recovering.reason or None,
        fault_time=format_rfc3339(started) if started is not None else None,
        resume_time=format_rfc3339(resumed),
        duration_seconds=seconds,
        step=step,
    )


def await_progress(run: PassState) -> None:
    """Every worker is ready but training has not advanced yet: Recovering stays, and says so."""
    recovering = _condition(run, cond.COND_RECOVERING)
    step = _current_step(run)
    waiting = (
        f"training to advance past step {step}"
        if step is not None
        else "training to advance to its first step"
    )
    if not steps_reported(run) and ranks_reported(run):
        waiting = "the ranks of every worker to start again"
    message = f"all {run.job.nodes} workers are ready; waiting for {waiting}"
    if recovering.message != message:
        reason = recovering.reason or cond.REASON_RECOVERING
        run.condition(cond.COND_RECOVERING, True, reason, message)


# -- in-job restarts rtj-launch timed --


def note_launcher_restart(run: PassState) -> None:
    """status.lastRecovery from the newest in-job restart rtj-launch timed, for a job whose restarts
    rtj-launch counts; not while the operator recovers the job, nor one that faulted before the end
    of the recovery recorded (the operator's recovery included the restarts it caused)."""
    if cond.condition_true(run.conditions, cond.COND_RECOVERING):
        return
    timed = [
        r.last_recovery
        for r in _reports(run)
        if r.restarts_source is RestartsSource.LAUNCHER and r.last_recovery is not None
    ]
    newest = max((t for t in timed if t.kind == cond.REASON_IN_JOB_RESTART), key=_resumed, default=None)
    if newest is None or newest.fault_time is None:
        return
    recorded = parse_rfc3339(run.last_recovery.resume_time if run.last_recovery is not None else None)
    if recorded is not None and newest.fault_time <= recorded:
        return
    seconds = newest.recovery_seconds
    if seconds is None:
        seconds = max(0.0, (newest.time - newest.fault_time).total_seconds())
    run.last_recovery = RecoveryStatus(
        reason=cond.REASON_IN_JOB_RESTART,
        fault_time=format_rfc3339(newest.fault_time),
        resume_time=format_rfc3339(newest.time),
        duration_seconds=round(seconds, 1),
        step=newest.step,
    )


def _resumed(recovery: RecoveryReport) -> datetime:
    return recovery.time
