"""`reconcile(job, observed, now) -> Plan`: one pass over one job, as an ordered script of policies.

Read top to bottom, it is the operator's design (docs/architecture.md, "The operator"):

1. A finished job keeps what it must and expires after its TTL; a suspended job gives up its pods.
2. Otherwise: resume if it was suspended, drop what is beyond the spec, detect the workers lost
   since the last pass and count them against the budget (`failures`); a job out of budget fails.
   Workers on a node that goes within minutes (a spot interruption notice) are moved (`moves`).
3. Judge the spares' nodes, then drive the store pod (under Supervisor), every worker and spare
   toward a running pod (`placement`; a worker terminating gracefully gets a surge pod that asks
   for its replacement's node meanwhile: `surges`),
   unless the job's FSx file system is not allowed for its namespace (`filesystems`), the API
   server refused one of the job's children for this spec (`admission`) or too few nodes could
   ever hold a worker (`capacity`).
4. Set Ready/Recovering/Succeeded (`lifecycle`; DrainWaiting for a job whose PodDisruptionBudget
   holds a drain, `drains`; a recovery ends when training advances again,
   `training`) and take an in-job restart rtj-launch timed as the last recovery (`training`), judge
   whether training stalled (`training`) and whether the spec sets fields the training ignores
   (`library`), assert the base children before any new pod, advise a checkpoint interval
   (`checkpoint_advice`), and write it all as the next status.

The trainers' progress reports are folded first, so that every policy sees this pass's step. A worker
whose command cannot start fails the job at once (`startup`, from `failures`).

Pure: the caller (`rtj_operator.runtime.job_pass`) writes `Plan.status` first, then applies the actions.
"""

from __future__ import annotations

from datetime import datetime

from rtj_operator.api import CheckpointAdviceStatus, CheckpointStatus, ProgressStatus
from rtj_operator.decide import (
    admission,
    capacity,
    checkpoint_advice,
    drains,
    failures,
    filesystems,
    library,
    lifecycle,
    moves,
    placement,
    surges,
    training,
)
from rtj_operator.decide.actions import Plan
from rtj_operator.decide.state import PassState
from rtj_operator.observe import JobView, Observed
from rtj_operator.progress import fold_progress

# The shortest requeue the plan asks for (seconds): moments already past are looked at again soon.
MIN_REQUEUE_SECONDS = 0.5


def reconcile(job: JobView, observed: Observed, now: datetime) -> Plan:
    """Decide, from the job and what is observed of it at `now`, the next status and actions."""
    run = PassState.begin(job, observed, now)
    _fold_progress(run)
    if lifecycle.finished(run):
        lifecycle.keep_finished(run)
    elif job.suspend:
        lifecycle.suspend(run)
        filesystems.hold_disallowed(run)
    else:
        _run_active(run)
    training.watch_stall(run)
    drains.watch_drains(run)
    library.watch_settings(run)
    lifecycle.ensure_base(run)
    return _plan(run)


def _run_active(run: PassState) -> None:
    lifecycle.resume(run)
    lifecycle.remove_surplus(run)
    losses = failures.detect_losses(run)
    if losses and not failures.handle_losses(run, losses):
        return  # out of budget: the job failed
    moves.move_off_departing_nodes(run)
    failures.record_spare_faults(run)
    first_start = run.start_time is None
    placement.run_store(run)  # Supervisor only: the store pod before the pods that need it
    placement.run_workers(run)
    surges.run_surges(run)
    placement.run_spares(run)
    filesystems.hold_disallowed(run)
    admission.hold_creates(run)
    capacity.hold_pods(run)
    admission.clear_refusal(run)
    lifecycle.mark_started(run, first_start)
    lifecycle.update_running_conditions(run)
    training.note_launcher_restart(run)


def _fold_progress(run: PassState) -> None:
    """Fold the pods' progress reports (workers', and under the Supervisor launcher the hot
    spares' whose ranks took over) into restarts, progress and lastCheckpoint."""
    reports = [(p.uid, p.report) for _, p in sorted(run.pods.items()) if p.report is not None]
    previous = {
        "restarts": run.restarts.counted().to_status(),
        "progress": run.progress.to_status() if run.progress is not None else None,
        "lastCheckpoint": run.last_checkpoint.to_status() if run.last_checkpoint is not None else None,
    }
    leaving = {p.uid for p in run.pods.values() if p.deleting}
    folded = fold_progress(previous, reports, run.observed.offsets, run.now, leaving)
    run.folded = folded
    run.restarts.in_process = folded.in_process_restarts
    run.restarts.in_job = folded.in_job_restarts
    run.progress = ProgressStatus.model_validate(folded.progress) if folded.progress else None
    run.last_checkpoint = (
        CheckpointStatus.model_validate(folded.last_checkpoint) if folded.last_checkpoint else None
    )
    training.note_advance(run)


def _advise_checkpoints(run: PassState) -> None:
    """status.checkpointAdvice from this pass's reports (none: it stays as it was, so an idle job is not
    rewritten). The save cost is kept from status until a report measures a newer one."""
    if run.folded is None or not run.folded.reported:
        return
    cost = run.folded.save_cost_seconds
    if cost is None and run.checkpoint_advice is not None:
        cost = run.checkpoint_advice.save_cost_seconds
    advice = checkpoint_advice.advise(
        save_cost_seconds=cost,
        faults=run.restarts.counted().total,
        training_seconds=run.folded.training_seconds,
        step_seconds=run.progress.step_time_seconds if run.progress is not None else None,
        configured_steps=run.job.model.spec.checkpoint.interval_steps,
    )
    run.checkpoint_advice = CheckpointAdviceStatus.model_validate(advice)


def _plan(run: PassState) -> Plan:
    run.note_reported_faults()
    _advise_checkpoints(run)
    offsets = run.folded.offsets if run.folded is not None else {}
    status = run.to_status()
    requeue = None
    if run.requeue is not None:
        requeue = max(MIN_REQUEUE_SECONDS, (run.requeue - run.now).total_seconds())
    return Plan(
        status=status,
        status_changed=lifecycle.comparable(status.to_status()) != lifecycle.comparable(run.job.status),
        actions=tuple(run.actions),
        events=tuple(run.events),
        requeue_after=requeue,
        offsets=offsets,
        counters=run.counters,
    )
