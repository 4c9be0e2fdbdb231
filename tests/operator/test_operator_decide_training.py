"""Whether training advances (decide.training): the Stalled condition and its Events, and a recovery
that ends when the step advances again, not when the pods are ready."""

from __future__ import annotations

import json
from datetime import timedelta

from operator_world import T0, WORKER, World, node_of, running_world
from rtj_contract.times import format_rfc3339, parse_rfc3339
from rtj_operator import events
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.training import recovery_resumed, stall_deadline
from rtj_operator.progress import parse_report

STALL = 60  # spec.progress.stallAfterSeconds of these tests


def report(world: World, step: int, *, fault_free_for: float = 0.0) -> str:
    """A report made now (or `fault_free_for` seconds ago) at `step`."""
    return json.dumps(
        {
            "v": 1,
            "time": format_rfc3339(world.now - timedelta(seconds=fault_free_for)),
            "step": step,
            "stepTimeSeconds": 0.5,
            "usefulStepSeconds": 1.0,
            "trainStartTime": format_rfc3339(T0),
        }
    )


def at_step(world: World, step: int, *, made_ago: float = 0.0) -> None:
    """Every current worker reports `step`."""
    for index in range(world.view().nodes):
        pod = world.pod(WORKER, index)
        parsed = parse_report(report(world, step, fault_free_for=made_ago))
        assert pod is not None and parsed is not None
        world.reports[pod["metadata"]["uid"]] = parsed


def stalled_world() -> World:
    world = running_world(progress={"stallAfterSeconds": STALL})
    at_step(world, 10)
    world.reconcile()
    return world


def test_the_deadline_counts_from_the_later_of_the_last_step_and_readiness() -> None:
    ready, step = T0, T0 + timedelta(seconds=30)
    assert stall_deadline(step, ready, STALL) == step + timedelta(seconds=STALL)
    assert stall_deadline(None, ready, STALL) == ready + timedelta(seconds=STALL)
    # Workers ready after the last step (a restart): the restart is not a stall until it had its time.
    assert stall_deadline(step, step + timedelta(seconds=5), STALL) == step + timedelta(seconds=STALL + 5)
    assert stall_deadline(step, None, STALL) is None


def test_a_step_that_does_not_advance_is_a_stall_reported_once_and_cleared_by_the_next_step() -> None:
    world = stalled_world()
    not_stalled = world.condition(cond.COND_STALLED)
    assert (not_stalled["status"], not_stalled["reason"]) == ("False", cond.REASON_NOT_STALLED)
    assert world.status()["progress"]["currentStep"] == 10
    advanced_at = parse_rfc3339(world.status()["progress"]["lastAdvanceTime"])
    assert advanced_at == world.now
    # The operator asks to look again when the stall time is up, even with no event in between.
    plan = world.reconcile()
    assert plan.requeue_after == STALL
    world.tick(STALL - 1)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["status"] == "False"
    world.tick(1)
    world.reconcile()
    stalled = world.condition(cond.COND_STALLED)
    assert (stalled["status"], stalled["reason"]) == ("True", cond.REASON_NO_PROGRESS)
    assert stalled["message"] == (
        f"training has not advanced past step 10 for {STALL} s (spec.progress.stallAfterSeconds: {STALL})"
    )
    assert world.status()["state"] == "Stalled"
    assert world.reasons().count(events.TRAINING_STALLED) == 1
    # Once per stall: later passes neither repeat the Warning nor rewrite status.
    world.tick(120)
    assert not world.reconcile().status_changed
    assert world.reasons().count(events.TRAINING_STALLED) == 1
    at_step(world, 11)
    world.reconcile()
    resumed = world.condition(cond.COND_STALLED)
    assert (resumed["status"], resumed["reason"]) == ("False", events.TRAINING_RESUMED)
    assert world.status()["state"] == "Running"
    assert events.TRAINING_RESUMED in world.reasons()


def test_no_first_step_after_the_workers_are_ready_is_a_stall() -> None:
    world = running_world(progress={"stallAfterSeconds": STALL})
    ready_at = parse_rfc3339(world.condition(cond.COND_READY)["lastTransitionTime"])
    assert ready_at is not None
    world.now = ready_at + timedelta(seconds=STALL)
    world.reconcile()
    stalled = world.condition(cond.COND_STALLED)
    assert stalled["status"] == "True"
    assert stalled["message"].startswith(f"no training step reported in the {STALL} s since every worker")


def test_suspended_and_finished_jobs_are_not_stalled() -> None:
    world = stalled_world()
    world.tick(STALL)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["status"] == "True"
    world.job["spec"]["suspend"] = True
    world.settle()
    suspended = world.condition(cond.COND_STALLED)
    assert (suspended["status"], suspended["reason"]) == ("False", events.SUSPENDED)
    world.tick(10 * STALL)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["status"] == "False"


def test_a_recovery_ends_when_training_advances_not_when_its_workers_are_ready() -> None:
    world = stalled_world()
    at_step(world, 40)
    world.tick(5)
    world.reconcile()
    # Worker 1's node is lost: the operator counts the fault and replaces the pod.
    world.node_not_ready(node_of(world, WORKER, 1))
    world.tick(11)
    world.reconcile()
    recovering = world.condition(cond.COND_RECOVERING)
    assert (recovering["status"], recovering["reason"]) == ("True", events.NODE_LOST)
    fault_time = recovering["lastTransitionTime"]
    # While the operator restarts the worker, stalls are not judged.
    assert world.condition(cond.COND_STALLED)["reason"] == cond.REASON_WORKERS_NOT_READY
    world.reports.clear()  # the lost pod's report is gone with it; the survivor's ran on to step 40
    world.settle()
    assert world.condition(cond.COND_READY)["status"] == "True"
    # Every pod is ready, but no step yet: still recovering, and saying what it waits for.
    recovering = world.condition(cond.COND_RECOVERING)
    assert recovering["status"] == "True" and recovering["reason"] == events.NODE_LOST
    assert recovering["message"].endswith("waiting for training to advance past step 40")
    assert world.status()["state"] == "Recovering"
    assert events.JOB_RECOVERED not in world.reasons()
    # The replacement resumes from step 30 (no checkpoint in these reports): that is no advance ...
    at_step(world, 30)
    world.tick(3)
    world.reconcile()
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"
    # ... the first step after it is.
    at_step(world, 31)
    world.tick(2)
    world.reconcile()
    recovered = world.condition(cond.COND_RECOVERING)
    assert (recovered["status"], recovered["reason"]) == ("False", events.JOB_RECOVERED)
    assert world.status()["state"] == "Running"
    last = world.status()["lastRecovery"]
    assert last["reason"] == events.NODE_LOST and last["faultTime"] == fault_time
    assert last["resumeTime"] == format_rfc3339(world.now) and last["step"] == 31
    fault = parse_rfc3339(fault_time)
    assert fault is not None
    assert last["durationSeconds"] == (world.now - fault).total_seconds()
    assert world.reasons().count(events.JOB_RECOVERED) == 1


def test_a_restart_that_never_resumes_training_is_a_stall() -> None:
    world = stalled_world()
    world.set_pod(WORKER, 1, lambda p: p["status"].update(phase="Failed", conditions=[]))
    world.reconcile()
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"
    world.reports.clear()
    world.settle()
    ready_at = parse_rfc3339(world.condition(cond.COND_READY)["lastTransitionTime"])
    assert ready_at is not None and world.condition(cond.COND_STALLED)["status"] == "False"
    world.now = ready_at + timedelta(seconds=STALL)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["status"] == "True"
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"
    assert world.status()["state"] == "Stalled"


def test_a_report_made_before_the_fault_does_not_end_the_recovery() -> None:
    start = T0 + timedelta(seconds=100)
    kwargs = {"reports_progress": True, "recovery_start": start}
    assert not recovery_resumed(advanced=True, advance_report_time=start - timedelta(seconds=1), **kwargs)
    assert recovery_resumed(advanced=True, advance_report_time=start, **kwargs)
    assert not recovery_resumed(advanced=False, advance_report_time=None, **kwargs)
    # A trainer that never reported progress: the pods' readiness is all there is.
    assert recovery_resumed(
        reports_progress=False, advanced=False, advance_report_time=None, recovery_start=start
    )


def test_a_job_whose_trainer_reports_nothing_recovers_when_its_workers_are_ready() -> None:
    world = running_world()
    world.set_pod(WORKER, 0, lambda p: p["status"].update(phase="Failed", conditions=[]))
    world.settle()
    recovered = world.condition(cond.COND_RECOVERING)
    assert (recovered["status"], recovered["reason"]) == ("False", events.JOB_RECOVERED)
    assert recovered["message"].startswith("all 2 workers are ready again")
    assert world.status()["lastRecovery"]["step"] is None  # no step to tell
