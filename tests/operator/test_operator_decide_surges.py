"""Surge pods (decide.surges), as one pass after another decides them: a worker deleted with its grace
period on a node that is not lost, with no spare to take its place, gets a surge pod `J-surge-<i>` in
the same pass, off its node and off nodes that are being taken out; once the old pod is gone its
replacement takes the surge pod's node if the surge pod runs there (and the surge pod goes), else the
scheduler places it. No surge for a node loss, where a spare is left to take the place, where the
spares take part in the training, for a gang restart, or once the job stops; a surge pod counts as no
worker, no fault and no budget, and a quota that refuses it blocks nothing."""

from __future__ import annotations

import copy
from typing import Any

from operator_world import SPARE, WORKER, World, _affinity_nodes, job_body, node_of, running_world
from rtj_contract import env as env_names
from rtj_operator import constants, decide, events
from rtj_operator.decide import conditions as cond

SURGE = constants.ROLE_SURGE


def pod_creates(plan: decide.Plan) -> dict[str, dict[str, Any]]:
    """The pods a pass creates, by name."""
    return {
        a.name: a.manifest for a in plan.actions if isinstance(a, decide.CreateObject) and a.kind == "Pod"
    }


def deletes(world: World, name: str) -> list[decide.DeletePod]:
    return [a for a in world.actions_applied if isinstance(a, decide.DeletePod) and a.name == name]


def surge_entries(world: World) -> list[dict[str, Any]]:
    return [e for e in world.status()["workers"]["pods"] if e["role"] == SURGE]


def surges_ever_created(world: World) -> list[str]:
    return [
        a.name
        for a in world.actions_applied
        if isinstance(a, decide.CreateObject) and a.name.startswith("train-surge-")
    ]


def start(world: World, role: str, index: int) -> None:
    """The pod's kubelet starts it (it was scheduled)."""
    world.set_pod(
        role,
        index,
        lambda p: p.update(status={"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
    )


def end_old_worker(world: World, index: int) -> None:
    """The drained node's kubelet ends the old pod after the checkpoint at SIGTERM."""
    del world.pods[f"train-worker-{index}"]


def budget(world: World) -> tuple[int, int]:
    found = world.status().get("budget") or {}
    return found.get("failuresUsed", 0), found.get("disruptions", 0)


def container_env(manifest: dict[str, Any]) -> dict[str, str | None]:
    (container,) = manifest["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def drained(world: World, index: int) -> str:
    """`kubectl drain` of worker `index`'s node: a cordon, then the eviction; the node's name."""
    node = node_of(world, WORKER, index)
    world.cordon(node)
    world.evict(WORKER, index)
    return node


def test_a_worker_terminating_gracefully_without_a_spare_gets_a_surge_pod_at_once_off_its_node() -> None:
    world = running_world(nodes=2, node_count=5)
    old = world.pod(WORKER, 1)["metadata"]["uid"]  # type: ignore[index]
    node = node_of(world, WORKER, 1)
    world.cordon("node-4")  # a node being taken out: no surge goes there either
    world.evict(WORKER, 1)  # the node itself stays schedulable: a plain eviction
    plan = world.reconcile()
    created = pod_creates(plan)
    assert list(created) == ["train-surge-1"]
    surge = created["train-surge-1"]
    must, must_not = _affinity_nodes(surge)
    assert not must and {node, "node-4"} <= must_not
    labels = surge["metadata"]["labels"]
    assert labels[constants.LABEL_ROLE] == SURGE and constants.LABEL_WORKER_INDEX not in labels
    # Rendered as a spare outside the training: the worker's container and size, no rank.
    worker = world.pod(WORKER, 0)
    assert worker is not None
    assert surge["spec"]["containers"][0]["resources"] == worker["spec"]["containers"][0]["resources"]
    assert surge["spec"]["containers"][0]["command"] == worker["spec"]["containers"][0]["command"]
    env = container_env(surge)
    assert env[env_names.ROLE] == "spare" and env_names.NODE_RANK not in env
    # The old pod is left to its kubelet: one incarnation of worker 1, still checkpointing.
    still = world.pod(WORKER, 1)
    assert still is not None and still["metadata"]["uid"] == old and still["metadata"]["deletionTimestamp"]
    assert deletes(world, "train-worker-1") == []
    assert [(e["index"], e["state"]) for e in surge_entries(world)] == [(1, "Creating")]
    assert events.SURGE_CREATED in world.reasons() and plan.counters["surges_created"] == 1
    # A surge pod is no worker, no fault, no budget.
    world.schedule()
    start(world, SURGE, 1)
    world.reconcile()
    status = world.status()
    assert status["workers"]["ready"] == 1 and status["workers"]["readySpares"] == 0
    assert budget(world) == (0, 1) and not status.get("nodeFaults")
    assert [(e["state"], e["nodeName"]) for e in surge_entries(world)] == [
        ("Running", node_of(world, SURGE, 1))
    ]


def test_the_replacement_takes_the_running_surge_pods_node_and_the_surge_pod_goes() -> None:
    world = running_world(nodes=2, node_count=4)
    old_node = drained(world, 1)
    world.reconcile()
    world.schedule()
    surge_node = node_of(world, SURGE, 1)
    assert surge_node not in {old_node, node_of(world, WORKER, 0)}
    start(world, SURGE, 1)
    world.reconcile()
    end_old_worker(world, 1)
    plan = world.reconcile()
    replacement = pod_creates(plan)["train-worker-1"]
    assert _affinity_nodes(replacement)[0] == {surge_node}  # pinned to the surge pod's node
    assert [d.grace_seconds for d in deletes(world, "train-surge-1")] == [None]  # graceful, as a spare's
    assert events.SURGE_USED in world.reasons() and events.WORKER_REPLACED in world.reasons()
    used = next(e for e in world.events if e.reason == events.SURGE_USED)
    assert surge_node in used.message and plan.counters["surges_used"] == 1
    assert surge_entries(world) == []
    world.settle(rounds=20)
    assert node_of(world, WORKER, 1) == surge_node and world.pod(SURGE, 1) is None
    status = world.status()
    assert status["state"] == "Running" and budget(world) == (0, 1)
    assert not status.get("nodeFaults") and not status.get("excludedNodes")


def test_a_surge_pod_not_running_when_the_old_pod_is_gone_goes_and_the_scheduler_places_the_replacement() -> (
    None
):
    world = running_world(nodes=2, node_count=4)
    drained(world, 1)
    world.reconcile()
    assert world.pod(SURGE, 1) is not None  # never scheduled: no node free for it yet
    end_old_worker(world, 1)
    plan = world.reconcile()
    assert _affinity_nodes(pod_creates(plan)["train-worker-1"])[0] == set()  # not pinned
    assert world.pod(SURGE, 1) is None and deletes(world, "train-surge-1")
    assert events.SURGE_USED not in world.reasons() and surge_entries(world) == []
    world.settle(rounds=20)
    assert world.status()["state"] == "Running" and world.pod(SURGE, 1) is None


def test_a_worker_on_a_lost_node_gets_no_surge_and_one_drained_in_the_same_pass_does() -> None:
    world = running_world(nodes=3, node_count=7, failurePolicy={"nodeLossGraceSeconds": 10})
    lost = node_of(world, WORKER, 1)
    world.node_not_ready(lost)
    world.tick(11)
    drained(world, 2)
    world.reconcile()
    assert world.pod(SURGE, 1) is None and world.pod(SURGE, 2) is not None
    assert [d.grace_seconds for d in deletes(world, "train-worker-1")] == [0]  # the node-loss path
    world.settle(rounds=20)
    assert surges_ever_created(world) == ["train-surge-2"]
    assert world.status()["state"] == "Running" and budget(world) == (1, 1)


def test_a_ready_spare_left_takes_the_place_and_only_a_worker_without_one_gets_a_surge() -> None:
    world = running_world(nodes=3, node_count=7, hotSpares=1)
    spare_node = node_of(world, SPARE, 0)
    drained(world, 1)
    drained(world, 2)
    world.reconcile()
    # One spare for two workers: the first takes it, the second gets a surge pod.
    assert world.pod(SURGE, 1) is None and world.pod(SURGE, 2) is not None
    world.schedule()
    surge_node = node_of(world, SURGE, 2)
    world.kubelets()  # the surge pod starts, the drained pods end
    world.settle(rounds=20)
    assert node_of(world, WORKER, 1) == spare_node and node_of(world, WORKER, 2) == surge_node
    assert events.SPARE_USED in world.reasons() and events.SURGE_USED in world.reasons()
    assert surges_ever_created(world) == ["train-surge-2"] and world.status()["state"] == "Running"


def test_no_surge_where_the_spares_take_part_in_the_training() -> None:
    standby = {"host": "StorePod", "spares": "Standby"}
    taking_part = World.with_nodes(job_body(nodes=2, hotSpares=1, rendezvous=standby), 6)
    supervised = World.with_nodes(
        job_body(nodes=2, hotSpares=1, faultTolerance={"launcher": "Supervisor"}), 6
    )
    without = World.with_nodes(job_body(nodes=2, rendezvous={"host": "StorePod"}), 6)
    for world in (taking_part, supervised, without):
        world.settle()
        assert world.status()["state"] == "Running"
        drained(world, 1)
        world.reconcile()
    # The same drain without spares in the training (nor any spare) gets its surge pod.
    assert surges_ever_created(without) == ["train-surge-1"]
    for world in (taking_part, supervised):
        world.settle(rounds=20)
        assert surges_ever_created(world) == [] and events.SURGE_CREATED not in world.reasons()


def with_running_surge(world: World, index: int) -> None:
    """Worker `index` drained, and its surge pod running."""
    drained(world, index)
    world.reconcile()
    world.schedule()
    start(world, SURGE, index)
    world.reconcile()
    assert [e["index"] for e in surge_entries(world)] == [index]


def test_a_gang_restart_makes_no_surge_and_drops_the_one_there_is() -> None:
    world = running_world(nodes=3, node_count=7)
    with_running_surge(world, 1)
    # Worker 0 hosts the rendezvous (FtLauncher): its drain restarts every worker.
    drained(world, 0)
    world.reconcile()
    assert events.GANG_RESTART in world.reasons()
    assert [d.grace_seconds for d in deletes(world, "train-surge-1")] == [None]
    assert surge_entries(world) == []
    world.settle(rounds=20)
    assert surges_ever_created(world) == ["train-surge-1"] and world.pod(SURGE, 1) is None
    assert world.status()["state"] == "Running" and events.SURGE_USED not in world.reasons()


def test_a_surge_pod_goes_when_the_job_is_suspended_or_fails() -> None:
    suspended = running_world(nodes=2, node_count=5)
    failing = running_world(nodes=3, node_count=7, failurePolicy={"maxNodeReplacements": 0})
    for world in (suspended, failing):
        with_running_surge(world, 1)
    suspended.job["spec"]["suspend"] = True
    suspended.reconcile()
    failing.node_not_ready(node_of(failing, WORKER, 2))  # a node loss the budget does not allow
    failing.tick(11)
    failing.reconcile()
    assert failing.condition(cond.COND_FAILED)["status"] == "True"
    for world in (suspended, failing):
        assert deletes(world, "train-surge-1") and surge_entries(world) == []
        world.settle(rounds=20)
        assert world.pod(SURGE, 1) is None and surges_ever_created(world) == ["train-surge-1"]
    suspended.job["spec"]["suspend"] = False  # resumed: the workers come back, no surge with them
    suspended.settle(rounds=20)
    assert suspended.status()["state"] == "Running" and surges_ever_created(suspended) == ["train-surge-1"]


def test_a_surge_pod_that_fails_is_created_again_and_counts_as_no_fault() -> None:
    world = running_world(nodes=2, node_count=5)
    drained(world, 1)
    world.reconcile()
    world.schedule()
    first = world.pod(SURGE, 1)["metadata"]["uid"]  # type: ignore[index]
    world.set_pod(SURGE, 1, lambda p: p.update(status={"phase": "Failed"}))
    world.reconcile()
    assert [d.uid for d in deletes(world, "train-surge-1")] == [first]
    del world.pods["train-surge-1"]  # its kubelet ends it; the old worker pod still checkpoints
    world.reconcile()
    again = world.pod(SURGE, 1)
    assert again is not None and again["metadata"]["uid"] != first
    assert world.reasons().count(events.SURGE_CREATED) == 1
    assert events.WORKER_FAILED not in world.reasons() and events.NODE_LOST not in world.reasons()
    assert budget(world) == (0, 1) and not world.status().get("nodeFaults")


def test_a_surge_pod_the_quota_refuses_blocks_nothing_and_is_not_asked_for_again() -> None:
    world = running_world(nodes=2, node_count=4)
    world.quota_pods = len(world.pods)  # no room for one more pod
    drained(world, 1)
    world.reconcile()
    assert events.SURGE_REFUSED in world.reasons() and surge_entries(world) == []
    assert not world.status()["conditions"] or all(
        c["type"] != cond.COND_BLOCKED or c["status"] != "True" for c in world.status()["conditions"]
    )
    world.reconcile()
    assert world.reasons().count(events.SURGE_REFUSED) == 1  # asked for once
    world.kubelets()  # the old pod ends: the replacement takes its place in the quota
    world.settle(rounds=20)
    assert world.status()["state"] == "Running" and world.pod(SURGE, 1) is None


def test_a_surge_pod_nothing_wants_is_deleted_and_the_switch_turns_surges_off() -> None:
    world = running_world(nodes=2, node_count=4)
    drained(world, 1)
    world.reconcile()
    left = copy.deepcopy(world.pods["train-surge-1"])
    world.settle(rounds=20)
    world.pods["train-surge-1"] = left  # left behind (an operator that stopped between two passes)
    world.reconcile()
    assert len(deletes(world, "train-surge-1")) == 2
    off = running_world(nodes=2, node_count=4, disruption={"surge": False})
    drained(off, 1)
    off.settle(rounds=20)
    assert surges_ever_created(off) == [] and off.status()["state"] == "Running"


def test_a_surge_whose_create_a_crash_lost_is_created_by_the_next_pass() -> None:
    world = running_world(nodes=2, node_count=4)
    drained(world, 1)
    world.reconcile(stop_after=0)  # status written (the surge is wanted), nothing applied
    assert [e["index"] for e in surge_entries(world)] == [1] and world.pod(SURGE, 1) is None
    world.reconcile()
    assert world.pod(SURGE, 1) is not None and world.reasons().count(events.SURGE_CREATED) == 1
