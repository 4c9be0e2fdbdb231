"""Admission (decide.admission): a child the API server refuses becomes a condition in the same pass,
and the operator does not try again until the spec changes or the slow recheck is due."""

from __future__ import annotations

from operator_world import T0, WORKER, World, job_body
from rtj_operator import decide, events
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.admission import REFUSAL_RECHECK_SECONDS


def quota_world(quota: int = 1) -> World:
    world = World.with_nodes(job_body(nodes=2), 4)
    world.quota_pods = quota
    return world


def test_a_quota_refusal_is_a_condition_with_the_servers_message_in_one_pass() -> None:
    world = quota_world()
    world.reconcile()
    blocked = world.condition(cond.COND_BLOCKED)
    assert blocked["status"] == "True" and blocked["reason"] == events.QUOTA_EXCEEDED
    assert "exceeded quota: q" in blocked["message"] and "train-worker-1" in blocked["message"]
    assert blocked["observedGeneration"] == 1
    assert world.reasons().count(events.QUOTA_EXCEEDED) == 1
    assert world.creates() == 2  # worker 0 was admitted, worker 1 refused


def test_no_retry_until_the_recheck_and_no_repeated_warning() -> None:
    world = quota_world()
    world.reconcile()
    world.settle(rounds=30, step=5.0)  # 150 s of pod events and passes
    assert world.creates() == 2
    assert world.status()["state"] == "Blocked"  # before Pending: the job cannot get its pods
    world.tick(REFUSAL_RECHECK_SECONDS)
    plan = world.reconcile()
    assert any(isinstance(a, decide.CreateObject) and a.kind == "Pod" for a in plan.actions)
    assert world.creates() == 3  # one recheck, refused again
    assert world.reasons().count(events.QUOTA_EXCEEDED) == 1  # same message: no second Warning
    assert world.condition(cond.COND_BLOCKED)["status"] == "True"


def test_a_held_pass_asks_to_be_woken_for_the_recheck() -> None:
    world = quota_world()
    world.reconcile()
    world.tick(10)
    plan = world.reconcile()
    assert plan.actions == () and plan.requeue_after == REFUSAL_RECHECK_SECONDS - 10


def test_a_spec_change_retries_at_once_and_admitted_pods_clear_the_condition() -> None:
    world = quota_world()
    world.reconcile()
    world.quota_pods = None  # the quota was raised
    world.job["spec"]["env"] = [{"name": "X", "value": "1"}]
    world.job["metadata"]["generation"] = 2
    world.settle()
    assert world.pod(WORKER, 1) is not None and world.status()["state"] == "Running"
    blocked = world.condition(cond.COND_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("False", cond.REASON_NOT_BLOCKED)


def test_a_rejected_child_that_is_not_a_quota() -> None:
    refusal = decide.Refusal(
        "Pod",
        "train-worker-0",
        422,
        "Invalid",
        'Pod "train-worker-0" is invalid: spec.containers[0].image: Required value',
    )
    status, changed, emitted = decide.record_refusal({}, 3, refusal, T0)
    blocked = status["conditions"][0]
    assert changed and blocked["reason"] == events.CHILD_REJECTED and blocked["observedGeneration"] == 3
    assert "spec.containers[0].image: Required value" in blocked["message"]
    assert [(e.type, e.reason) for e in emitted] == [(events.WARNING, events.CHILD_REJECTED)]
    again, changed, emitted = decide.record_refusal(status, 3, refusal, T0)
    assert not changed and emitted == () and again == status
