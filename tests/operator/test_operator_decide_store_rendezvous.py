"""The decisions under FtLauncher with rendezvous.host StorePod: the store pod hosts ft_launcher's
rendezvous, so losing worker 0's node replaces that pod alone (a spare's node first, as for any
worker under FtLauncher); losing the store pod restarts every worker around a fresh store. (That the
job is not Ready without its store pod: test_operator_decide_supervisor.)"""

from __future__ import annotations

from typing import Any

from operator_world import SPARE, WORKER, World, job_body, lose_store_node, node_of, uids
from rtj_operator import events
from rtj_operator.decide import conditions as cond

STORE_POD = "train-store"
STORE_RENDEZVOUS: dict[str, Any] = {"host": "StorePod"}


def store_world(**spec: Any) -> World:
    world = World.with_nodes(job_body(nodes=2, rendezvous=STORE_RENDEZVOUS, **spec), 6)
    world.settle()
    assert world.status()["state"] == "Running" and STORE_POD in world.pods
    world.events.clear()
    return world


def test_losing_worker_zeros_node_replaces_that_pod_alone_on_the_spares_node() -> None:
    world = store_world(hotSpares=1)
    before = uids(world)
    lost, spare_node = node_of(world, WORKER, 0), node_of(world, SPARE, 0)
    world.node_not_ready(lost)
    world.tick(11)
    world.settle()
    assert events.GANG_RESTART not in world.reasons() and events.NODE_LOST in world.reasons()
    assert events.SPARE_USED in world.reasons()
    status = world.status()
    assert status["restarts"]["podReplacement"] == 1 and status["nodeFaults"][0]["nodeName"] == lost
    after = uids(world)
    assert after["train-worker-0"] != before["train-worker-0"] and node_of(world, WORKER, 0) == spare_node
    for name in (STORE_POD, "train-worker-1"):
        assert after[name] == before[name], name
    assert status["state"] == "Running"


def test_losing_the_store_pods_node_restarts_the_workers_around_a_fresh_store() -> None:
    world = store_world(hotSpares=1)
    before = uids(world)
    lost = lose_store_node(world, STORE_POD)
    assert events.STORE_LOST in world.reasons() and world.reasons().count(events.GANG_RESTART) == 1
    after = uids(world)
    for name in (STORE_POD, "train-worker-0", "train-worker-1"):
        assert after[name] != before[name], name
    # As any FtLauncher worker replacement, one went to the spare's node, and the spare was refilled.
    assert events.SPARE_USED in world.reasons() and "train-spare-0" in world.pods
    store_node = world.pods[STORE_POD]["spec"]["nodeName"]
    assert store_node != lost and store_node not in {node_of(world, WORKER, i) for i in (0, 1)}
    assert world.status()["state"] == "Running"


def test_a_store_that_cannot_host_the_rendezvous_fails_the_job_at_once_spending_no_budget() -> None:
    # rtj-store on an NVRx release whose rendezvous it cannot host (0.5, 0.6: the barrier rendezvous
    # without NVRx's control node) says so in its termination message: no fresh store would do better.
    world = store_world()
    detail = "rtj-store: NVRx 0.6.0 has a barrier rendezvous but no control node: use rendezvous.host Worker0"
    terminated = {"exitCode": 78, "reason": "Error", "message": f"FaultReason: StartupFailed\n{detail}\n"}
    status = {
        "phase": "Failed",
        "containerStatuses": [{"name": "store", "state": {"terminated": terminated}}],
    }
    world.pods[STORE_POD]["status"] = status
    world.reconcile()
    failed = world.condition(cond.COND_FAILED)
    assert (failed["status"], failed["reason"]) == ("True", events.STARTUP_FAILED)
    assert (
        failed["message"]
        == f"the store pod (pod {STORE_POD}) cannot serve the job's stores as configured: {detail}"
    )
    job = world.status()
    assert job["state"] == "Failed" and job.get("budget", {}).get("failuresUsed", 0) == 0
    assert events.GANG_RESTART not in world.reasons()


def test_a_store_pod_that_fails_otherwise_still_restarts_the_gang() -> None:
    world = store_world()
    terminated = {"exitCode": 1, "reason": "Error", "message": "Traceback ...\nOSError: out of memory\n"}
    status = {
        "phase": "Failed",
        "containerStatuses": [{"name": "store", "state": {"terminated": terminated}}],
    }
    world.pods[STORE_POD]["status"] = status
    world.reconcile()
    assert events.STORE_LOST in world.reasons() and events.GANG_RESTART in world.reasons()
    assert world.status()["state"] != "Failed"
