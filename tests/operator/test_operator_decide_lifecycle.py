"""Lifecycle (decide.lifecycle): create, idle, suspend and resume, success and TTL, deletion, bad specs."""

from __future__ import annotations

import pytest
from operator_world import SPARE, T0, WORKER, World, job_body, running_world
from rtj_contract.times import format_rfc3339
from rtj_operator import constants, decide, events
from rtj_operator.api import Condition
from rtj_operator.decide import conditions as cond


def test_create_renders_every_child_and_records_workers() -> None:
    world = World.with_nodes(job_body(nodes=3, hotSpares=1), 5)
    plan = world.reconcile()
    kinds = [a.kind for a in plan.actions if isinstance(a, decide.CreateObject)]
    # The Service, storage and RBAC come before the pods that need them.
    assert kinds == [
        "ServiceAccount",
        "PersistentVolumeClaim",
        "Service",
        "Pod",
        "Pod",
        "Pod",
        "Pod",
    ]
    assert [e["state"] for e in world.status()["workers"]["pods"]] == ["Creating"] * 4
    assert world.status()["state"] == "Pending"
    assert world.status()["startTime"] == format_rfc3339(T0)
    world.settle()
    status = world.status()
    assert status["state"] == "Running"
    assert status["workers"]["readyText"] == "3/3" and status["workers"]["readySpares"] == 1
    assert world.condition("Ready")["reason"] == cond.REASON_ALL_WORKERS_READY


def test_an_idle_job_needs_no_writes() -> None:
    world = running_world()
    for _ in range(3):
        world.tick(60)
        plan = world.reconcile()
        assert plan.actions == () and not plan.status_changed and plan.events == ()


def test_a_part_of_the_status_its_models_refuse_is_read_as_absent_and_the_rest_is_kept() -> None:
    """A status some other writer (or an older operator) left in a shape the models refuse: that part
    is read as absent and rewritten, the workers' records and the counts beside it are kept, and the
    pass does not fail."""
    world = running_world()
    pods = {name: pod["metadata"]["uid"] for name, pod in world.pods.items()}
    world.job["status"]["restarts"] = {"inProcess": "many", "podReplacement": 2}
    world.job["status"]["nodeFaults"] = [{"count": 1}]  # no nodeName
    plan = world.reconcile()
    status = world.status()
    assert plan.status_changed and not any(isinstance(a, decide.CreateObject) for a in plan.actions)
    assert status["restarts"] == {"inProcess": 0, "inJob": 0, "podReplacement": 0, "total": 0}
    assert status["nodeFaults"] == [] and status["state"] == "Running"
    assert [e["state"] for e in status["workers"]["pods"]] == ["Running", "Running"]
    assert {name: pod["metadata"]["uid"] for name, pod in world.pods.items()} == pods


def test_suspend_deletes_pods_keeps_storage_and_resume_recreates() -> None:
    world = running_world(hotSpares=1)
    world.job["spec"]["suspend"] = True
    world.job["metadata"]["generation"] = 2
    world.settle()
    assert world.pods == {} and world.status()["state"] == "Suspended"
    assert world.condition("Suspended")["status"] == "True" and events.SUSPENDED in world.reasons()
    assert world.status()["observedGeneration"] == 2
    world.job["spec"]["suspend"] = False
    world.settle()
    assert world.status()["state"] == "Running" and len(world.pods) == 3
    assert world.condition("Suspended")["reason"] == events.RESUMED
    assert world.status()["restarts"]["podReplacement"] == 0


def test_success_when_every_worker_succeeded_then_ttl_deletes_the_job() -> None:
    world = running_world(hotSpares=1, ttlSecondsAfterFinished=60)
    for i in range(2):
        world.set_pod(WORKER, i, lambda p: p.update(status={"phase": "Succeeded"}))
    world.reconcile()
    status = world.status()
    assert status["state"] == "Succeeded" and status["completionTime"] == format_rfc3339(world.now)
    assert events.JOB_SUCCEEDED in world.reasons()
    world.kubelets()
    assert world.pod(SPARE, 0) is None  # spares are not needed any more
    world.tick(30)
    plan = world.reconcile()
    assert not world.job_deleted and plan.requeue_after == pytest.approx(30)
    world.tick(31)
    world.reconcile()
    assert world.job_deleted


def test_deleting_a_retained_job_keeps_the_volume_and_delete_policy_removes_it() -> None:
    retained = World.with_nodes(job_body(), 2).view()
    assert decide.finalize(retained, {}) == ()
    deleting = World.with_nodes(
        job_body(checkpoint={"retentionPolicy": "Delete", "storage": {"dynamic": {}}}), 2
    )
    actions = decide.finalize(deleting.view(), {"n1": [(constants.TAINT_EXCLUDED, "train", "NoSchedule")]})
    assert decide.DeleteObject("v1", "PersistentVolumeClaim", "train-checkpoints", "ml") in actions
    assert decide.TaintNode("n1", constants.TAINT_EXCLUDED, "train", "NoSchedule", remove=True) in actions


def test_invalid_spec_sets_a_naming_condition_once() -> None:
    status, changed, emitted = decide.reconcile_invalid({}, 3, "spec.nodes: must be >= 1", T0)
    assert changed and emitted[0].reason == events.INVALID_SPEC and emitted[0].type == events.WARNING
    ready = status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert ready["message"] == "spec.nodes: must be >= 1"
    again = decide.reconcile_invalid(status, 3, "spec.nodes: must be >= 1", T0)
    assert again[1] is False and again[2] == ()


def test_condition_transition_time_moves_only_on_flips() -> None:
    conditions: list[Condition] = []
    decide.set_condition(conditions, "Ready", status=False, reason="A", message="a", now=T0, generation=1)
    later = T0.replace(hour=13)
    decide.set_condition(conditions, "Ready", status=False, reason="B", message="b", now=later, generation=2)
    written = conditions[0].to_status()
    assert written["lastTransitionTime"] == format_rfc3339(T0) and written["reason"] == "B"
    decide.set_condition(conditions, "Ready", status=True, reason="C", message="c", now=later, generation=2)
    assert conditions[0].to_status()["lastTransitionTime"] == format_rfc3339(later)
