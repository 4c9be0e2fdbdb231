"""A training script of one's own (no rtj library), as the pure decisions see it: where the step comes
from, Stalled=Unknown while none is reported, a recovery that ends when every worker's ranks run again,
an in-job restart rtj-launch timed, StartupFailed (rtj-launch's verdict, or three identical failures),
Failed that is not Ready, the Blocked state, and SettingsIgnored.

Reports are what rtj-launch serves without a library report (docs/architecture.md, "Progress
contract"): `sources`, `ranks`, `events`, and a step only when spec.progress.stepLogPattern matched.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from operator_world import T0, WORKER, World, running_world
from rtj_contract.times import format_rfc3339, parse_rfc3339
from rtj_operator import events
from rtj_operator.api import Condition, ConditionStatus
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.conditions import set_condition, state_from_conditions
from rtj_operator.decide.startup import STARTUP_FAILURES_TO_FAIL
from rtj_operator.progress import parse_report

STALL = 60
OWN_SCRIPT: dict[str, Any] = {
    "command": ["python", "/app/train.py"],
    "faultTolerance": {"inProcess": {"enabled": False}},
}
STORAGE = {"dynamic": {"storageClassName": "standard"}}
MISSING = "python: can't open file '/app/trian.py': [Errno 2] No such file or directory"


def own_world(**spec: Any) -> World:
    progress = {"stallAfterSeconds": STALL, **spec.pop("progress", {})}
    return running_world(**{**OWN_SCRIPT, **spec, "progress": progress})


def serve(
    world: World,
    index: int,
    *,
    source: str = "NotReported",
    step: int | None = None,
    started: datetime | None = T0,
    running: int = 2,
    extra: dict[str, Any] | None = None,
) -> None:
    """Worker `index`'s pod serves the report rtj-launch makes of its ranks, now."""
    body: dict[str, Any] = {
        "v": 1,
        "time": format_rfc3339(world.now),
        "nodeRank": index,
        "restarts": {"inProcess": 0, "inJob": 0},
        "finished": False,
        "trainStartTime": format_rfc3339(T0),
        "ranks": {
            "running": running,
            "startTime": format_rfc3339(started) if started else None,
            "restartCount": 0,
        },
        "sources": {"step": source, "restarts": "Launcher"},
        **(extra or {}),
    }
    if step is not None:
        body["step"] = step
    pod, parsed = world.pod(WORKER, index), parse_report(json.dumps(body))
    assert pod is not None and parsed is not None
    world.reports[pod["metadata"]["uid"]] = parsed


def serve_all(world: World, **kwargs: Any) -> None:
    for index in range(world.view().nodes):
        serve(world, index, **kwargs)


def fail(world: World, index: int, code: int, message: str) -> None:
    """Worker `index`'s container exits with `code` and `message` as its termination message."""
    terminated = {"exitCode": code, "reason": "Error", "message": message}
    status = {
        "phase": "Failed",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}],
    }
    world.set_pod(WORKER, index, lambda p: p.update(status=status))


def entry(world: World, index: int) -> dict[str, Any]:
    return next(e for e in world.status()["workers"]["pods"] if e["role"] == WORKER and e["index"] == index)


def condition(world: World, type_: str) -> dict[str, Any] | None:
    return next((c for c in world.status()["conditions"] if c["type"] == type_), None)


# -- Stalled: judged only when steps are reported --


def test_a_script_that_reports_no_step_is_never_stalled_but_unknown() -> None:
    world = own_world()
    stalled = world.condition(cond.COND_STALLED)
    assert (stalled["status"], stalled["reason"]) == ("Unknown", cond.REASON_STEPS_NOT_REPORTED)
    assert stalled["message"].startswith("no worker has reported progress yet")
    serve_all(world)
    world.reconcile()
    stalled = world.condition(cond.COND_STALLED)
    assert stalled["status"] == "Unknown" and "spec.progress.stepLogPattern" in stalled["message"]
    assert world.status()["progress"]["sources"] == {"step": "NotReported", "restarts": "Launcher"}
    assert "step" not in world.status()["progress"]
    world.tick(10 * STALL)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["status"] == "Unknown"
    assert events.TRAINING_STALLED not in world.reasons()
    assert world.status()["state"] == "Running"


def test_a_declared_pattern_that_matches_nothing_is_a_stall() -> None:
    world = own_world(progress={"stepLogPattern": r"^step (?P<step>\d+)"})
    # Declared: judged even before the first report.
    assert world.condition(cond.COND_STALLED)["reason"] == cond.REASON_NOT_STALLED
    serve_all(world, source="LogPattern")
    ready_at = parse_rfc3339(world.condition(cond.COND_READY)["lastTransitionTime"])
    assert ready_at is not None
    world.now = ready_at + timedelta(seconds=STALL)
    world.reconcile()
    stalled = world.condition(cond.COND_STALLED)
    assert stalled["status"] == "True"
    assert stalled["message"].startswith(f"no training step reported in the {STALL} s")


def test_a_step_from_the_log_pattern_is_judged_as_the_librarys() -> None:
    world = own_world()
    serve_all(world, source="LogPattern", step=5)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["reason"] == cond.REASON_NOT_STALLED
    progress = world.status()["progress"]
    assert (progress["step"], progress["currentStep"]) == (5, 5)
    assert progress["sources"] == {"step": "LogPattern", "restarts": "Launcher"}
    world.tick(STALL)
    world.reconcile()
    assert world.condition(cond.COND_STALLED)["status"] == "True"
    assert world.reasons().count(events.TRAINING_STALLED) == 1


# -- the end of a recovery without steps --


def test_without_steps_a_recovery_ends_when_every_workers_ranks_run_again() -> None:
    world = own_world()
    serve_all(world)
    world.reconcile()
    fail(world, 1, 1, "RuntimeError: NCCL error")
    world.reconcile()
    recovering = world.condition(cond.COND_RECOVERING)
    fault = parse_rfc3339(recovering["lastTransitionTime"])
    assert recovering["status"] == "True" and fault is not None
    world.reports.clear()
    world.settle()
    assert world.condition(cond.COND_READY)["status"] == "True"
    # Pods ready, but the ranks not seen running since the fault: still recovering, and saying so.
    serve_all(world, started=fault - timedelta(seconds=5))
    world.reconcile()
    recovering = world.condition(cond.COND_RECOVERING)
    assert recovering["status"] == "True"
    assert recovering["message"].endswith("waiting for the ranks of every worker to start again")
    back = fault + timedelta(seconds=20)
    serve(world, 0, started=back - timedelta(seconds=3))
    world.reconcile()
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"  # worker 1's ranks are not back
    serve(world, 1, started=back, running=0)
    world.reconcile()
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"  # started, but none running
    serve(world, 1, started=back)
    world.tick(4)
    world.reconcile()
    recovered = world.condition(cond.COND_RECOVERING)
    assert (recovered["status"], recovered["reason"]) == ("False", events.JOB_RECOVERED)
    assert recovered["message"].startswith("the ranks of all 2 workers are running again 20 s after")
    last = world.status()["lastRecovery"]
    assert last["reason"] == events.WORKER_FAILED and last["faultTime"] == format_rfc3339(fault)
    assert (last["resumeTime"], last["durationSeconds"], last["step"]) == (format_rfc3339(back), 20.0, None)


def test_an_in_job_restart_that_rtj_launch_timed_is_the_last_recovery() -> None:
    world = own_world()
    fault, back = T0 + timedelta(seconds=100), T0 + timedelta(seconds=112)
    event = {"time": format_rfc3339(back), "kind": "InJobRestart", "faultTime": format_rfc3339(fault),
             "recoverySeconds": 12.4, "step": None, "source": "Launcher"}  # fmt: skip
    serve_all(world, extra={"events": [event], "restarts": {"inProcess": 0, "inJob": 1}})
    world.reconcile()
    status = world.status()
    assert status["restarts"]["inJob"] == 1
    assert status["lastRecovery"] == {
        "reason": cond.REASON_IN_JOB_RESTART,
        "faultTime": format_rfc3339(fault),
        "resumeTime": format_rfc3339(back),
        "durationSeconds": 12.4,
        "step": None,
    }
    assert not world.reconcile().status_changed
    # The library's own events are not taken (its jobs' lastRecovery is the operator's, as ever).
    library = own_world()
    library_sources = {"sources": {"step": "Library", "restarts": "Library"}, "library": "0.1.0"}
    serve_all(library, step=3, extra={"events": [event], **library_sources})
    library.reconcile()
    assert "lastRecovery" not in library.status()


def test_restarts_inside_an_operator_recovery_belong_to_it() -> None:
    world = own_world()
    serve_all(world)
    world.reconcile()
    fail(world, 1, 1, "RuntimeError: NCCL error")
    world.reconcile()
    world.reports.clear()
    world.settle()
    fault = parse_rfc3339(world.condition(cond.COND_RECOVERING)["lastTransitionTime"])
    assert fault is not None
    during = {"time": format_rfc3339(fault + timedelta(seconds=8)), "kind": "InJobRestart",
              "faultTime": format_rfc3339(fault + timedelta(seconds=2)), "recoverySeconds": 6.0}  # fmt: skip
    serve_all(world, started=fault + timedelta(seconds=8), extra={"events": [during]})
    world.reconcile()
    assert world.status()["lastRecovery"]["reason"] == events.WORKER_FAILED
    world.tick(5)
    world.reconcile()
    assert world.status()["lastRecovery"]["reason"] == events.WORKER_FAILED


# -- Failed, Blocked --


def test_a_failed_job_is_not_ready_in_the_same_pass() -> None:
    world = running_world(failurePolicy={"maxNodeReplacements": 0})
    assert world.condition(cond.COND_READY)["status"] == "True"
    fail(world, 1, 1, "boom")
    world.reconcile()
    failed, ready = world.condition(cond.COND_FAILED), world.condition(cond.COND_READY)
    assert (failed["status"], failed["reason"]) == ("True", events.RESTART_BUDGET_EXHAUSTED)
    assert (ready["status"], ready["reason"]) == ("False", events.RESTART_BUDGET_EXHAUSTED)
    assert world.condition(cond.COND_RECOVERING)["status"] == "False"
    assert world.status()["state"] == "Failed"


def test_a_job_failed_by_an_earlier_operator_is_made_not_ready() -> None:
    world = running_world()
    world.job["status"]["conditions"].append(
        {"type": "Failed", "status": "True", "reason": events.FAILED_BY_RULE, "message": "m"}
    )
    world.reconcile()
    ready = world.condition(cond.COND_READY)
    assert (ready["status"], ready["reason"]) == ("False", events.FAILED_BY_RULE)


def test_blocked_reads_after_the_ends_and_before_training() -> None:
    def state(**true: bool) -> str:
        return state_from_conditions([Condition(type=t, status=ConditionStatus.TRUE) for t in true])

    assert state(Blocked=True, Ready=True, Stalled=True, Recovering=True) == "Blocked"
    assert state(Blocked=True, Failed=True) == "Failed"
    assert state(Blocked=True, Succeeded=True) == "Succeeded"
    assert state(Blocked=True, Suspended=True) == "Suspended"


def test_a_condition_can_be_unknown_and_flips_like_any_other() -> None:
    conditions: list[Condition] = []
    later = T0 + timedelta(seconds=9)
    common: dict[str, Any] = {"reason": "R", "message": "m", "generation": 1}
    assert set_condition(conditions, "Stalled", status=False, now=T0, **common)
    assert set_condition(conditions, "Stalled", status=ConditionStatus.UNKNOWN, now=later, **common)
    assert conditions[0].to_status()["status"] == "Unknown"
    assert conditions[0].to_status()["lastTransitionTime"] == format_rfc3339(later)
    assert not set_condition(conditions, "Stalled", status=ConditionStatus.UNKNOWN, now=T0, **common)


# -- StartupFailed --


def test_rtj_launchs_startup_verdict_fails_the_job_at_once_spending_no_budget() -> None:
    world = own_world()
    detail = f"the training command failed the same way on 2 tries before its first step: exit 2: {MISSING}"
    fail(world, 1, 78, f"FaultReason: StartupFailed\n{detail}\n")
    world.reconcile()
    failed = world.condition(cond.COND_FAILED)
    assert (failed["status"], failed["reason"]) == ("True", events.STARTUP_FAILED)
    assert failed["message"] == f"worker 1 (pod train-worker-1) cannot start its training command: {detail}"
    assert world.condition(cond.COND_READY)["status"] == "False"
    status = world.status()
    assert status["state"] == "Failed" and status["restarts"]["podReplacement"] == 0
    assert status.get("budget", {}).get("failuresUsed", 0) == 0
    assert events.STARTUP_FAILED in world.reasons() and events.GANG_RESTART not in world.reasons()


def test_a_rule_that_matches_the_startup_verdict_first_wins() -> None:
    world = own_world(
        failurePolicy={"rules": [{"action": "RestartJob", "onFaultReasons": ["StartupFailed"]}]}
    )
    fail(world, 1, 78, "FaultReason: StartupFailed\nno luck\n")
    world.reconcile()
    assert condition(world, cond.COND_FAILED) is None
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"


# -- DeterministicFailure --

REPEATED = "the training failed the same way after step 57 on 2 tries in a row: exit 1: ValueError: bad batch"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (93, f"FaultReason: DeterministicFailure\n{REPEATED}\n"),  # rtj-launch's verdict
        (93, "Traceback (most recent call last):\nValueError: bad batch\n"),  # NVRx 0.7's no-restart exit
    ],
)
def test_a_failure_that_recurs_at_one_step_fails_the_job_at_once_spending_no_budget(
    code: int, message: str
) -> None:
    world = own_world()
    fail(world, 1, code, message)
    world.reconcile()
    failed = world.condition(cond.COND_FAILED)
    assert (failed["status"], failed["reason"]) == ("True", events.DETERMINISTIC_FAILURE)
    assert failed["message"].startswith("worker 1 (pod train-worker-1) fails the same way at the same step")
    assert ("after step 57" in failed["message"]) is message.startswith("FaultReason")
    assert "ValueError: bad batch" in failed["message"]
    status = world.status()
    assert status["state"] == "Failed" and status["restarts"]["podReplacement"] == 0
    assert status.get("budget", {}).get("failuresUsed", 0) == 0
    assert events.DETERMINISTIC_FAILURE in world.reasons() and events.GANG_RESTART not in world.reasons()


@pytest.mark.parametrize(
    "rule",
    [{"onFaultReasons": ["DeterministicFailure"]}, {"onExitCodes": {"operator": "In", "values": [93]}}],
)
def test_a_rule_that_matches_the_deterministic_verdict_first_keeps_restarting(rule: dict[str, Any]) -> None:
    world = own_world(failurePolicy={"rules": [{"action": "RestartJob", **rule}]})
    fail(world, 1, 93, f"FaultReason: DeterministicFailure\n{REPEATED}\n")
    world.reconcile()
    assert condition(world, cond.COND_FAILED) is None
    assert world.condition(cond.COND_RECOVERING)["status"] == "True"
    assert world.status()["budget"]["failuresUsed"] == 1


def fail_and_restart(world: World, message: str, code: int = 1) -> None:
    fail(world, 1, code, message)
    world.reconcile()
    if condition(world, cond.COND_FAILED) is not None:
        return
    world.reports.clear()
    for _ in range(10):  # past the growing backoff, however long the world stays idle before it
        world.settle()
        if all(entry(world, i)["state"] == "Running" for i in range(world.view().nodes)):
            return
        world.tick(30)
    raise AssertionError("the workers were not replaced")


def test_three_pods_of_a_worker_failing_the_same_way_before_any_step_fail_the_job() -> None:
    world = own_world()
    for tries in range(1, STARTUP_FAILURES_TO_FAIL):
        # A log tail's times and process ids differ on every try: numbers aside, it is the same failure.
        fail_and_restart(world, f"12:00:0{tries} [pid {100 + tries}] Traceback ...\n{MISSING}")
        assert condition(world, cond.COND_FAILED) is None
        assert entry(world, 1)["startFailures"] == tries
        assert (
            entry(world, 1)["lastStartFailure"]
            == f"exit 1: 12:00:0{tries} [pid {100 + tries}] Traceback ... {MISSING}"
        )
        assert "startFailures" not in entry(world, 0)
    fail_and_restart(world, f"12:00:09 [pid 109] Traceback ...\n{MISSING}")
    failed = world.condition(cond.COND_FAILED)
    assert (failed["status"], failed["reason"]) == ("True", events.STARTUP_FAILED)
    assert failed["message"] == (
        f"worker 1 failed the same way on {STARTUP_FAILURES_TO_FAIL} consecutive pods before any training "
        f"step: exit 1: 12:00:09 [pid 109] Traceback ... {MISSING}"
    )
    assert world.condition(cond.COND_READY)["status"] == "False"
    assert world.status()["restarts"]["podReplacement"] == STARTUP_FAILURES_TO_FAIL - 1


def test_another_failure_or_a_step_between_them_starts_the_count_again() -> None:
    world = own_world(progress={"stepLogPattern": r"^step (?P<step>\d+)"})
    fail_and_restart(world, "ImportError: no module named x")
    fail_and_restart(world, "ImportError: no module named y")
    assert entry(world, 1)["startFailures"] == 1
    fail_and_restart(world, "ImportError: no module named y", code=2)
    assert entry(world, 1)["startFailures"] == 1  # another exit code: another failure
    # The next pods train: a step, and the recovery ends on it.
    serve_all(world, source="LogPattern", step=4)
    world.tick(1)
    world.reconcile()
    assert world.condition(cond.COND_RECOVERING)["reason"] == events.JOB_RECOVERED
    assert "startFailures" not in entry(world, 1)
    for _ in range(STARTUP_FAILURES_TO_FAIL):
        fail_and_restart(world, "ImportError: no module named y")
    assert condition(world, cond.COND_FAILED) is None  # the first of the three had trained
    assert entry(world, 1)["startFailures"] == STARTUP_FAILURES_TO_FAIL - 1


# -- SettingsIgnored --


def test_settings_only_the_library_honours_are_reported_once_for_a_script_without_it() -> None:
    world = own_world(checkpoint={"storage": STORAGE, "intervalSteps": 50, "keep": 3})
    assert condition(world, cond.COND_SETTINGS_IGNORED) is None  # nothing reported yet
    serve_all(world)
    world.reconcile()
    # Reports without the library, but no training seen yet: a library's first report comes with its
    # first step, which may be minutes after the pods are Ready.
    assert condition(world, cond.COND_SETTINGS_IGNORED) is None
    world.tick(STALL + 1)
    serve_all(world)
    world.reconcile()
    ignored = world.condition(cond.COND_SETTINGS_IGNORED)
    assert (ignored["status"], ignored["reason"]) == ("True", cond.REASON_LIBRARY_NOT_IN_USE)
    # keep is its default; inProcess is turned off (it asks for nothing).
    assert "the training script ignores spec.checkpoint.intervalSteps (" in ignored["message"]
    world.tick(30)
    world.reconcile()
    assert world.reasons().count(events.SETTINGS_IGNORED) == 1
    assert [e.type for e in world.events if e.reason == events.SETTINGS_IGNORED] == [events.WARNING]
    assert world.status()["state"] == "Running"
    serve_all(world, extra={"library": "0.1.0"})
    world.reconcile()
    in_use = world.condition(cond.COND_SETTINGS_IGNORED)
    assert (in_use["status"], in_use["reason"]) == ("False", cond.REASON_LIBRARY_IN_USE)
    assert in_use["message"] == "the job uses the rtj library 0.1.0"
    assert world.status()["progress"]["library"] == "0.1.0"


def test_a_step_from_the_log_pattern_without_the_library_shows_the_ignored_settings_at_once() -> None:
    pattern = {"stepLogPattern": "s (\\d+)"}
    world = own_world(checkpoint={"storage": STORAGE, "intervalSteps": 50}, progress=pattern)
    serve_all(world, source="LogPattern", step=3)
    world.reconcile()
    ignored = world.condition(cond.COND_SETTINGS_IGNORED)
    assert (ignored["status"], ignored["reason"]) == ("True", cond.REASON_LIBRARY_NOT_IN_USE)


def test_rtj_train_or_a_script_that_sets_nothing_for_the_library_ignores_nothing() -> None:
    library_job = running_world(checkpoint={"storage": STORAGE, "intervalSteps": 50})
    serve_all(library_job, source="Library", step=1)
    library_job.reconcile()
    assert library_job.condition(cond.COND_SETTINGS_IGNORED)["reason"] == cond.REASON_LIBRARY_IN_USE
    own = own_world()
    serve_all(own)
    own.reconcile()
    own.tick(STALL + 1)
    serve_all(own)
    own.reconcile()
    assert own.condition(cond.COND_SETTINGS_IGNORED)["reason"] == cond.REASON_NO_LIBRARY_SETTINGS
    assert events.SETTINGS_IGNORED not in own.reasons() + library_job.reasons()
