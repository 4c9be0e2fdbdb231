"""The decisions under FtLauncher with rendezvous.spares Standby: the spares' ft_launchers wait in the
store pod's rendezvous as standby nodes, and one of them takes a lost node's place in the next round.
So a lost worker's replacement never takes a spare's node (the spare may already hold the lost rank):
it is created wherever it fits and stands by in turn; a spare that ends with the training is kept;
and a gang restart recreates the spares with the store pod (their launchers belong to the old
rendezvous). With HoldNode (the default) a replacement takes a spare's node, as
test_operator_decide_store_rendezvous shows."""

from __future__ import annotations

from typing import Any

from operator_world import SPARE, WORKER, World, job_body, lose_store_node, node_of, uids
from rtj_operator import events

STORE_POD = "train-store"
STANDBY: dict[str, Any] = {"host": "StorePod", "spares": "Standby"}


def standby_world(**spec: Any) -> World:
    world = World.with_nodes(job_body(nodes=2, hotSpares=1, rendezvous=STANDBY, **spec), 6)
    world.settle()
    assert world.status()["state"] == "Running" and STORE_POD in world.pods and "train-spare-0" in world.pods
    world.events.clear()
    return world


def test_a_lost_workers_replacement_goes_to_a_free_node_and_the_standby_spare_is_kept() -> None:
    world = standby_world()
    before = uids(world)
    lost, spare_node = node_of(world, WORKER, 1), node_of(world, SPARE, 0)
    world.node_not_ready(lost)
    world.tick(11)
    world.settle()
    assert events.NODE_LOST in world.reasons() and events.GANG_RESTART not in world.reasons()
    assert events.SPARE_USED not in world.reasons()
    after = uids(world)
    assert after["train-worker-1"] != before["train-worker-1"]
    for name in (STORE_POD, "train-worker-0", "train-spare-0"):
        assert after[name] == before[name], name
    assert node_of(world, SPARE, 0) == spare_node
    assert node_of(world, WORKER, 1) not in {lost, spare_node, node_of(world, WORKER, 0)}
    status = world.status()
    assert status["restarts"]["podReplacement"] == 1 and status["state"] == "Running"


def test_a_standby_spare_that_ends_with_the_training_is_kept_and_the_job_succeeds() -> None:
    world = standby_world()
    spare = world.pod(SPARE, 0)["metadata"]["uid"]  # type: ignore[index]
    world.set_pod(SPARE, 0, lambda p: p.update(status={"phase": "Succeeded"}))
    world.reconcile()
    assert world.pod(SPARE, 0)["metadata"]["uid"] == spare  # type: ignore[index]
    assert not world.pod(SPARE, 0)["metadata"].get("deletionTimestamp")  # type: ignore[index]
    for index in range(2):
        world.set_pod(WORKER, index, lambda p: p.update(status={"phase": "Succeeded"}))
    world.reconcile()
    assert world.status()["state"] == "Succeeded"


def test_losing_the_store_pods_node_recreates_the_standby_spares_with_the_store() -> None:
    world = standby_world()
    before = uids(world)
    lose_store_node(world, STORE_POD)
    assert events.STORE_LOST in world.reasons() and world.reasons().count(events.GANG_RESTART) == 1
    after = uids(world)
    assert not set(before.values()) & set(after.values())  # every pod is new, the spare's included
    assert world.status()["state"] == "Running"
