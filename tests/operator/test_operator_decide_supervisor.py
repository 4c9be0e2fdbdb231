"""The decisions under faultTolerance.launcher Supervisor: the store pod comes first and its loss
restarts every pod around a fresh store; any worker's node loss, worker 0's included, replaces that
pod alone (no gang restart, no spare given up: the spares' pods run the world's reserve ranks)."""

from __future__ import annotations

from typing import Any

import pytest
from operator_world import SPARE, WORKER, World, job_body, node_of, uids
from rtj_operator import decide, events

STORE_POD = "train-store"
SUPERVISOR: dict[str, Any] = {"launcher": "Supervisor"}


def supervisor_world(nodes: int = 2, node_count: int = 6, **spec: Any) -> World:
    world = World.with_nodes(job_body(nodes=nodes, faultTolerance=SUPERVISOR, **spec), node_count)
    world.settle()
    assert world.status()["state"] == "Running"
    world.events.clear()
    return world


def pod_creates(world: World, since: int = 0) -> list[str]:
    return [
        a.name
        for a in world.actions_applied[since:]
        if isinstance(a, decide.CreateObject) and a.kind == "Pod"
    ]


def test_the_store_pod_is_created_before_the_workers_and_recorded_apart_from_them() -> None:
    world = World.with_nodes(job_body(nodes=2, hotSpares=1, faultTolerance=SUPERVISOR), 5)
    world.reconcile()
    assert pod_creates(world) == [STORE_POD, "train-worker-0", "train-worker-1", "train-spare-0"]
    world.settle()
    status = world.status()
    assert status["state"] == "Running"
    assert status["store"]["podName"] == STORE_POD and status["store"]["state"] == "Running"
    assert status["store"]["nodeName"] == world.pods[STORE_POD]["spec"]["nodeName"]
    assert [(e["role"], e["index"]) for e in status["workers"]["pods"]] == [
        ("worker", 0),
        ("worker", 1),
        ("spare", 0),
    ]
    assert status["workers"]["ready"] == 2 and status["workers"]["readySpares"] == 1


@pytest.mark.parametrize(
    "store_pod_spec",
    [{"faultTolerance": SUPERVISOR}, {"rendezvous": {"host": "StorePod"}}],
    ids=["supervisor", "ft-launcher-rendezvous"],
)
def test_the_job_is_not_ready_while_its_store_pod_does_not_run(store_pod_spec: dict[str, Any]) -> None:
    world = World.with_nodes(job_body(nodes=2, **store_pod_spec), 4)
    world.reconcile()
    world.schedule()
    world.kubelets()
    world.pods[STORE_POD]["status"] = {"phase": "Pending"}
    world.reconcile()
    ready = world.condition("Ready")
    assert ready["status"] == "False" and f"store pod {STORE_POD} not running" in ready["message"]
    world.pods[STORE_POD]["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    world.reconcile()
    assert world.condition("Ready")["status"] == "True"


def test_losing_worker_zeros_node_replaces_that_pod_alone() -> None:
    world = supervisor_world(hotSpares=1)
    before = uids(world)
    lost = node_of(world, WORKER, 0)
    world.node_not_ready(lost)
    world.tick(11)
    plan = world.reconcile()
    assert events.GANG_RESTART not in world.reasons() and events.NODE_LOST in world.reasons()
    assert world.status()["restarts"]["podReplacement"] == 1
    assert world.status()["nodeFaults"][0]["nodeName"] == lost
    # The pod on the dead node is force-deleted; nothing else is touched.
    deletes = [a for a in plan.actions if isinstance(a, decide.DeletePod)]
    assert [(d.name, d.grace_seconds) for d in deletes] == [("train-worker-0", 0)]
    world.settle()
    after = uids(world)
    assert after["train-worker-0"] != before["train-worker-0"]
    for name in (STORE_POD, "train-worker-1", "train-spare-0"):
        assert after[name] == before[name], name
    # No spare was given up: the replacement went to a free node, and the spare still holds its own.
    assert events.SPARE_USED not in world.reasons()
    assert node_of(world, WORKER, 0) not in {lost, node_of(world, SPARE, 0), node_of(world, WORKER, 1)}
    assert world.status()["state"] == "Running"


def test_a_spares_lost_node_replaces_the_spare_alone() -> None:
    world = supervisor_world(hotSpares=1)
    before = uids(world)
    lost = node_of(world, SPARE, 0)
    world.node_not_ready(lost)
    world.tick(11)
    world.settle()
    after = uids(world)
    assert after["train-spare-0"] != before["train-spare-0"]
    assert all(after[n] == before[n] for n in (STORE_POD, "train-worker-0", "train-worker-1"))
    assert events.GANG_RESTART not in world.reasons()
    assert node_of(world, SPARE, 0) != lost


def test_losing_the_store_pods_node_restarts_every_pod_around_a_fresh_store() -> None:
    world = supervisor_world(hotSpares=1)
    before = uids(world)
    lost = world.pods[STORE_POD]["spec"]["nodeName"]
    world.node_not_ready(lost)
    world.tick(11)
    world.reconcile()
    status = world.status()
    assert events.STORE_LOST in world.reasons() and events.GANG_RESTART in world.reasons()
    assert status["restarts"]["podReplacement"] == 1 and status["budget"]["failuresUsed"] == 1
    assert status["nodeFaults"][0]["nodeName"] == lost
    assert status["store"]["state"] in {"Replacing", "Creating"}
    assert {e["state"] for e in status["workers"]["pods"] if e["role"] == "worker"} == {"Replacing"}
    mark = len(world.actions_applied)
    world.settle()
    after = uids(world)
    assert not set(before.values()) & set(after.values())  # every pod is new, the store's included
    assert world.pods[STORE_POD]["spec"]["nodeName"] != lost
    assert pod_creates(world, mark)[0] == STORE_POD
    assert world.status()["state"] == "Running"


def test_a_store_pod_that_failed_restarts_the_gang_counted_once() -> None:
    world = supervisor_world()
    world.pods[STORE_POD]["status"] = {"phase": "Failed", "message": "store crashed"}
    world.set_pod(WORKER, 1, lambda p: p.update(status={"phase": "Failed", "message": "world broken"}))
    world.reconcile()
    status = world.status()
    assert status["restarts"]["podReplacement"] == 1 and world.reasons().count(events.GANG_RESTART) == 1
    assert events.STORE_LOST in world.reasons()
    assert status["nodeFaults"] == []  # no node to blame
    world.settle()
    assert world.status()["state"] == "Running"


def test_no_worker_or_spare_is_created_while_the_old_store_pod_still_stands() -> None:
    world = supervisor_world(hotSpares=1)
    world.set_pod(WORKER, 0, lambda p: p.update(status={"phase": "Failed", "message": "world broken"}))
    old_store = world.pods[STORE_POD]["metadata"]["uid"]
    mark = len(world.actions_applied)
    world.reconcile()
    assert world.reasons().count(events.GANG_RESTART) == 1
    assert world.pods[STORE_POD]["metadata"].get("deletionTimestamp")
    # The old workers and spare are gone; the old store pod's kubelet has not finished yet.
    for name in [n for n in world.pods if n != STORE_POD]:
        del world.pods[name]
    world.tick(10)
    world.reconcile()
    assert world.pods[STORE_POD]["metadata"]["uid"] == old_store
    assert pod_creates(world, mark) == []
    world.kubelets()  # the old store pod is gone too
    world.reconcile()
    created = pod_creates(world, mark)
    assert created[0] == STORE_POD
    assert set(created) == {STORE_POD, "train-worker-0", "train-worker-1", "train-spare-0"}


def test_a_finished_job_removes_its_store_pod() -> None:
    world = supervisor_world()
    for index in range(2):
        world.set_pod(WORKER, index, lambda p: p.update(status={"phase": "Succeeded"}))
    plan = world.reconcile()
    assert world.status()["state"] == "Succeeded"
    assert any(isinstance(a, decide.DeletePod) and a.name == STORE_POD for a in plan.actions)
    world.kubelets()
    world.reconcile()
    assert STORE_POD not in world.pods and world.status()["store"]["state"] == "Succeeded"


def test_suspending_removes_the_store_pod_and_resuming_brings_it_back_first() -> None:
    world = supervisor_world()
    world.job["spec"]["suspend"] = True
    world.settle()
    assert world.pods == {} and world.status()["store"]["state"] == "Suspended"
    world.job["spec"]["suspend"] = False
    mark = len(world.actions_applied)
    world.settle()
    assert pod_creates(world, mark)[0] == STORE_POD
    assert world.status()["state"] == "Running" and world.status()["store"]["state"] == "Running"


def test_a_spare_whose_ranks_finished_with_the_world_is_kept_not_replaced() -> None:
    world = supervisor_world(hotSpares=1)
    spare = world.pod(SPARE, 0)["metadata"]["uid"]  # type: ignore[index]
    world.set_pod(SPARE, 0, lambda p: p.update(status={"phase": "Succeeded"}))
    mark = len(world.actions_applied)
    world.reconcile()
    assert world.pod(SPARE, 0)["metadata"]["uid"] == spare  # type: ignore[index]
    assert not world.pod(SPARE, 0)["metadata"].get("deletionTimestamp")  # type: ignore[index]
    assert pod_creates(world, mark) == []
    for index in range(2):
        world.set_pod(WORKER, index, lambda p: p.update(status={"phase": "Succeeded"}))
    world.reconcile()
    assert world.status()["state"] == "Succeeded"


def test_workers_failing_while_the_store_pods_node_is_in_doubt_wait_for_its_fate() -> None:
    world = supervisor_world(failurePolicy={"nodeLossGraceSeconds": 20})
    store_node = world.pods[STORE_POD]["spec"]["nodeName"]
    world.node_not_ready(store_node)
    world.tick(5)
    for index in range(2):
        world.set_pod(WORKER, index, lambda p: p.update(status={"phase": "Failed", "message": "store gone"}))
    plan = world.reconcile()
    assert world.status()["restarts"]["podReplacement"] == 0 and events.GANG_RESTART not in world.reasons()
    assert plan.requeue_after is not None and plan.requeue_after <= 15
    world.tick(16)
    world.reconcile()
    status = world.status()
    # One fault, the node's: a NodeLoss charged once, the workers' failures its consequence.
    assert status["restarts"]["podReplacement"] == 1 and status["budget"]["failuresUsed"] == 1
    assert world.reasons().count(events.GANG_RESTART) == 1 and events.STORE_LOST in world.reasons()
    assert events.WORKER_FAILED in world.reasons()
    assert status["nodeFaults"][0]["nodeName"] == store_node


def test_a_store_node_loss_seen_first_as_the_workers_failure_is_still_recorded() -> None:
    world = supervisor_world()
    store_node = world.pods[STORE_POD]["spec"]["nodeName"]
    # The node died a moment ago: its kubelet is gone, the node is not yet marked NotReady.
    for index in range(2):
        world.set_pod(WORKER, index, lambda p: p.update(status={"phase": "Failed", "message": "store gone"}))
    world.reconcile()
    assert world.reasons().count(events.GANG_RESTART) == 1 and events.STORE_LOST not in world.reasons()
    assert world.status()["store"]["state"] == "Replacing"
    world.node_not_ready(store_node)
    world.tick(11)
    plan = world.reconcile()
    assert events.NODE_LOST in world.reasons()
    assert world.status()["nodeFaults"][0]["nodeName"] == store_node
    assert world.status()["restarts"]["podReplacement"] == 1  # charged once, by the gang restart
    assert any(
        isinstance(a, decide.DeletePod) and a.name == STORE_POD and a.grace_seconds == 0 for a in plan.actions
    )
    world.settle()
    assert world.pods[STORE_POD]["spec"]["nodeName"] != store_node
    assert world.status()["state"] == "Running"


def test_a_job_resumed_at_once_waits_for_its_old_store_pod_to_go() -> None:
    world = supervisor_world()
    world.job["spec"]["suspend"] = True
    world.reconcile()
    assert world.pods[STORE_POD]["metadata"].get("deletionTimestamp")
    for name in [n for n in world.pods if n != STORE_POD]:
        del world.pods[name]  # the workers' kubelets were quicker than the store's
    world.job["spec"]["suspend"] = False
    mark = len(world.actions_applied)
    world.reconcile()
    assert pod_creates(world, mark) == []
    world.kubelets()
    world.reconcile()
    assert pod_creates(world, mark) == [STORE_POD, "train-worker-0", "train-worker-1"]


def test_an_ft_launcher_job_has_no_store_pod_and_still_restarts_the_gang_for_worker_zero() -> None:
    world = World.with_nodes(job_body(nodes=2, hotSpares=1), 5)
    world.settle()
    assert STORE_POD not in world.pods and "store" not in world.status()
    world.node_not_ready(node_of(world, WORKER, 0))
    world.tick(11)
    world.settle()
    assert world.reasons().count(events.GANG_RESTART) == 1 and events.SPARE_USED in world.reasons()
    assert STORE_POD not in world.pods and "store" not in world.status()
