"""An operator that crashes between any two API calls converges: no duplicate, orphan or lost pod,
and every fault is counted exactly once.

The operator writes status first and then applies a plan's actions in order; a crash can stop it
before the status write or after any number of actions. A fresh pass then starts from what is
observed (the status written so far and the objects that exist), as a restarted operator does.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_world import World, job_body
from rtj_operator import constants


def _fault_node_taint(world: World) -> None:
    pod = world.pod(constants.ROLE_WORKER, 1)
    assert pod is not None
    world.taint(pod["spec"]["nodeName"], "example.com/broken")


def _fault_worker_zero_node_deleted(world: World) -> None:
    pod = world.pod(constants.ROLE_WORKER, 0)
    assert pod is not None
    del world.nodes[pod["spec"]["nodeName"]]


def _fault_process_failure(world: World) -> None:
    world.set_pod(constants.ROLE_WORKER, 2, lambda p: p.update(status={"phase": "Failed"}))


def _fault_pod_deleted(world: World) -> None:
    del world.pods["train-worker-1"]


FAULTS: dict[str, Callable[[World], None]] = {
    "node-taint": _fault_node_taint,
    "worker0-node-deleted": _fault_worker_zero_node_deleted,
    "process-failure": _fault_process_failure,
    "pod-deleted": _fault_pod_deleted,
}


def crashy_settle(world: World, rng: random.Random, passes: int = 40) -> int:
    """Operator passes that crash at random points; returns how many passes crashed."""
    crashes = 0
    for _ in range(passes):
        plan = world.plan()
        roll = rng.random()
        if roll < 0.2:
            crashes += 1  # crashed before writing anything
        elif roll < 0.6 and plan.actions:
            world.reconcile(stop_after=rng.randrange(len(plan.actions)))
            crashes += 1
        else:
            world.reconcile()
        if rng.random() < 0.7:
            world.schedule()
        if rng.random() < 0.7:
            world.kubelets()
        world.tick(rng.choice([0.5, 1, 3, 6]))
    world.settle(rounds=30)
    return crashes


def assert_converged(world: World, *, nodes: int, spares: int, replacements: int) -> None:
    expected = {f"train-worker-{i}" for i in range(nodes)} | {f"train-spare-{k}" for k in range(spares)}
    assert set(world.pods) == expected  # nothing missing, nothing extra
    for pod in world.pods.values():
        assert pod["status"]["phase"] == "Running" and not pod["metadata"].get("deletionTimestamp")
    used = [p["spec"]["nodeName"] for p in world.pods.values()]
    assert len(used) == len(set(used))  # one pod per node
    status = world.status()
    assert status["state"] == "Running", status["conditions"]
    assert status["restarts"]["podReplacement"] == replacements


@pytest.mark.parametrize("fault", sorted(FAULTS))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_crashes_at_any_point_converge(fault: str, seed: int) -> None:
    rng = random.Random(seed)
    world = World.with_nodes(job_body(nodes=3, hotSpares=1, failurePolicy={"backoffSeconds": 2}), 7)
    crashy_settle(world, rng, passes=10)  # creation itself is crashed too
    assert_converged(world, nodes=3, spares=1, replacements=0)
    FAULTS[fault](world)
    crashy_settle(world, rng)
    assert_converged(world, nodes=3, spares=1, replacements=1)


def test_every_single_kill_point_of_a_node_loss_converges() -> None:
    """Exhaustively: crash after exactly k actions of each pass of a recovery, for every k."""
    for k in range(8):
        world = World.with_nodes(job_body(nodes=3, hotSpares=1, failurePolicy={"backoffSeconds": 0}), 7)
        world.settle()
        _fault_worker_zero_node_deleted(world)
        for _ in range(6):
            world.reconcile(stop_after=k)
            world.schedule()
            world.kubelets()
            world.tick(1)
        world.settle(rounds=30)
        assert_converged(world, nodes=3, spares=1, replacements=1)
