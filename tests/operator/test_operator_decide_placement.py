"""Placement and spares (decide.placement): hot spares, backoff, which pods and nodes are the job's."""

from __future__ import annotations

from operator_world import SPARE, WORKER, World, job_body, node_body, node_of, running_world
from rtj_operator import decide, events


def test_hot_spare_node_is_used_for_the_replacement_and_the_spare_replenished() -> None:
    world = running_world(nodes=2, node_count=4, hotSpares=1)
    spare_node = node_of(world, SPARE, 0)
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    assert node_of(world, WORKER, 1) == spare_node
    assert events.SPARE_USED in world.reasons()
    assert world.pod(SPARE, 0) is not None and node_of(world, SPARE, 0) != spare_node
    assert world.status()["workers"]["readySpares"] == 1


def test_backoff_spaces_replacements() -> None:
    world = running_world(failurePolicy={"backoffSeconds": 30})
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    first = world.pod(WORKER, 1)
    assert first is not None
    world.taint(node_of(world, WORKER, 1), "example.com/broken2")
    plan = world.reconcile()
    # Counted now, but the replacement waits until 30 s after the previous replacement pod was created.
    assert world.status()["restarts"]["podReplacement"] == 2
    assert not any(isinstance(a, decide.CreateObject) for a in plan.actions)
    assert plan.requeue_after is not None and plan.requeue_after <= 30


def test_pods_that_are_not_the_jobs_own_are_ignored() -> None:
    world = running_world()
    stranger = dict(world.pod(WORKER, 0))  # type: ignore[arg-type]
    stranger["metadata"] = {**stranger["metadata"], "name": "someone-elses", "uid": "x"}
    world.pods["someone-elses"] = stranger
    plan = world.reconcile()
    assert plan.actions == () and not plan.status_changed


def test_new_node_for_not_ready_is_avoided_for_new_pods() -> None:
    world = World.with_nodes(job_body(nodes=1), 2)
    world.nodes["node-0"] = node_body("node-0", ready="False")
    plan = world.reconcile()
    pod = next(a for a in plan.actions if isinstance(a, decide.CreateObject) and a.kind == "Pod")
    assert "node-0" in str(pod.manifest["spec"]["affinity"])


def test_a_spare_left_on_a_node_excluded_meanwhile_is_moved() -> None:
    # The pass that excludes the spare's lost node also decides the spare's deletion; the operator
    # stops between writing that status and deleting the pod, and the node recovers: the spare, on a
    # node the job no longer uses (and never gives up for a replacement), is moved all the same.
    world = running_world(nodes=1, node_count=3, hotSpares=1, failurePolicy={"repeatOffenderThreshold": 1})
    spare_node = node_of(world, SPARE, 0)
    world.node_not_ready(spare_node)
    world.tick(11)
    world.reconcile(stop_after=0)
    assert [e["nodeName"] for e in world.status()["excludedNodes"]] == [spare_node]
    world.node_ready(spare_node)
    world.settle()
    assert node_of(world, SPARE, 0) != spare_node
    assert world.status()["workers"]["readySpares"] == 1


def test_a_spare_that_took_a_replacements_pinned_node_gives_way_even_after_a_crash() -> None:
    world = running_world(nodes=1, node_count=3, hotSpares=2, failurePolicy={"backoffSeconds": 0})
    world.taint(node_of(world, SPARE, 1), "example.com/broken")
    world.settle()
    assert world.pod(SPARE, 1)["spec"].get("nodeName") is None  # type: ignore[index]  # no node left
    spare_node = node_of(world, SPARE, 0)
    world.taint(node_of(world, WORKER, 0), "example.com/broken")
    world.reconcile()  # the lost worker's pod goes
    world.kubelets()  # its node's kubelet is alive and ends it (never force-deleted)
    world.reconcile()  # its replacement is pinned to spare 0's node, and spare 0 given up
    world.kubelets()
    world.schedule()
    # Spare 1, created before the pin, takes the node first; the operator stops before acting on it.
    assert node_of(world, SPARE, 1) == spare_node
    world.reconcile(stop_after=0)
    world.nodes["fresh"] = node_body("fresh", since=world.now)
    world.settle(rounds=30)
    assert node_of(world, WORKER, 0) == spare_node
    assert world.status()["state"] == "Running"
