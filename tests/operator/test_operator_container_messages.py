"""What a failed or stuck worker's container says reaches the job: its exit code, reason and
termination message in the WorkerFailed Event and the Failed condition, its waiting reason in Ready."""

from __future__ import annotations

from typing import Any

from operator_world import T0, WORKER, World, job_body, running_world
from rtj_contract.times import format_rfc3339
from rtj_operator import events, observe, render
from rtj_operator.api import parse_job
from rtj_operator.decide import conditions as cond


def _container_status(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "trainer", "state": state, "lastState": last or {}, "ready": False, "restartCount": 0}


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train-worker-0",
            "uid": "u",
            "labels": {"resilient.training/role": "worker", "resilient.training/worker-index": "0"},
            "creationTimestamp": format_rfc3339(T0),
        },
        "spec": {"nodeName": "node-0"},
        "status": status,
    }


def test_workers_report_their_log_tail_when_they_fail_without_a_termination_message() -> None:
    job = parse_job(job_body(hotSpares=1))
    container = render.render_worker_pod(job, 0, uid="u")["spec"]["containers"][0]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    spare = render.render_spare_pod(job, 0, uid="u")["spec"]["containers"][0]
    assert spare["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_termination_message_exit_code_and_reason_are_read_and_truncated() -> None:
    cannot_run = {
        "terminated": {
            "exitCode": 128,
            "reason": "ContainerCannotRun",
            "message": 'exec: "rtj-launch": not found',
        }
    }
    pod = observe.observe_pod(_pod(phase="Failed", containerStatuses=[_container_status(cannot_run)]))
    assert pod is not None
    assert pod.message == (
        'container trainer exited with code 128 (ContainerCannotRun): exec: "rtj-launch": not found'
    )
    # lastState when the current state does not say (a restarted container), and a long log tail clipped.
    long_tail = {"terminated": {"exitCode": 1, "reason": "Error", "message": "x" * 5000}}
    pod = observe.observe_pod(
        _pod(phase="Failed", containerStatuses=[_container_status({"waiting": {}}, long_tail)])
    )
    assert pod is not None and pod.message.startswith("container trainer exited with code 1 (Error): xxx")
    assert len(pod.message) < 1100 and pod.message.endswith("...")
    # A pod-level message (eviction) comes first; a zero exit says nothing.
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    pod = observe.observe_pod(
        _pod(phase="Failed", message="evicted", containerStatuses=[_container_status(done)])
    )
    assert pod is not None and pod.message == "evicted"


def test_waiting_reasons_are_read_but_normal_start_steps_are_not() -> None:
    bad_config = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}}
    pod = observe.observe_pod(_pod(phase="Pending", containerStatuses=[_container_status(bad_config)]))
    assert pod is not None
    assert pod.waiting == 'container trainer waiting: CreateContainerConfigError: secret "s" not found'
    creating = {"waiting": {"reason": "ContainerCreating"}}
    pod = observe.observe_pod(_pod(phase="Pending", containerStatuses=[_container_status(creating)]))
    assert pod is not None and pod.waiting == ""


def test_a_failed_workers_message_reaches_the_event_and_the_failed_condition() -> None:
    world = running_world(failurePolicy={"maxNodeReplacements": 0})
    terminated = {
        "terminated": {
            "exitCode": 128,
            "reason": "ContainerCannotRun",
            "message": "OCI runtime create failed: /dev/nvidia0: no such device",
        }
    }
    world.set_pod(
        WORKER,
        1,
        lambda p: p.update(status={"phase": "Failed", "containerStatuses": [_container_status(terminated)]}),
    )
    world.reconcile()
    failed = [e.message for e in world.events if e.reason == events.WORKER_FAILED]
    assert failed and "ContainerCannotRun): OCI runtime create failed: /dev/nvidia0" in failed[0]
    condition = world.condition(cond.COND_FAILED)
    assert condition["reason"] == events.RESTART_BUDGET_EXHAUSTED
    assert "exited with code 128 (ContainerCannotRun): OCI runtime create failed" in condition["message"]


def test_a_worker_that_cannot_start_says_why_in_ready() -> None:
    world = World.with_nodes(job_body(nodes=2), 3)
    world.settle()
    pull = {"waiting": {"reason": "ErrImagePull", "message": 'pull "trainer:1": not found'}}
    world.set_pod(
        WORKER,
        1,
        lambda p: p.update(status={"phase": "Pending", "containerStatuses": [_container_status(pull)]}),
    )
    world.reconcile()
    ready = world.condition(cond.COND_READY)
    assert ready["status"] == "False" and ready["reason"] == cond.REASON_WORKERS_NOT_READY
    assert ready["message"] == (
        "1/2 workers ready; train-worker-1: container trainer waiting: ErrImagePull: "
        'pull "trainer:1": not found'
    )
