"""Planned disruptions apart from faults (rtj_operator.disruptions), as one pass after another decides
them: a cordon moves nothing, a drain's eviction is a disruption that spends no failure budget and
records no node fault, the evicted pod is ended by its kubelet (never force-deleted) and its
replacement waits for it, maintenance taints are disruptions too, and a real node loss after a drain
is still a fault. Also holds docs/operations.md's table of signals to the code's list."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from operator_world import SPARE, WORKER, World, _affinity_nodes, node_of, running_world
from rtj_contract import termination
from rtj_operator import decide, disruptions, events
from rtj_operator.decide import conditions as cond
from rtj_operator.nodehealth import NodeHealth

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def deletes(world: World, name: str) -> list[decide.DeletePod]:
    return [a for a in world.actions_applied if isinstance(a, decide.DeletePod) and a.name == name]


def budget(world: World) -> dict[str, int]:
    found: dict[str, int] = world.status().get("budget", {})
    return found


def excluded_by_affinity(world: World, role: str, index: int) -> set[str]:
    pod = world.pod(role, index)
    assert pod is not None
    return _affinity_nodes(pod)[1]


def test_a_cordon_moves_nothing_and_is_no_fault_but_new_workers_avoid_the_node() -> None:
    world = running_world(nodes=3, node_count=5)
    uids = {name: pod["metadata"]["uid"] for name, pod in world.pods.items()}
    cordoned = node_of(world, WORKER, 2)
    world.cordon(cordoned)
    world.settle()
    assert {name: pod["metadata"]["uid"] for name, pod in world.pods.items()} == uids
    assert not world.status().get("nodeFaults") and not world.status().get("excludedNodes")
    assert world.status()["restarts"]["podReplacement"] == 0
    assert events.NODE_LOST not in world.reasons()
    # A worker created now (worker 1 evicted) is kept off the cordoned node by its affinity.
    world.evict(WORKER, 1)
    world.reconcile()
    world.kubelets()
    world.settle(rounds=20)
    assert cordoned in excluded_by_affinity(world, WORKER, 1)
    assert node_of(world, WORKER, 2) == cordoned  # still there
    assert world.pod(WORKER, 2)["metadata"]["uid"] == uids["train-worker-2"]  # type: ignore[index]


def test_a_drain_is_a_disruption_the_kubelet_ends_the_pod_and_the_replacement_waits_for_it() -> None:
    world = running_world(nodes=2, node_count=3)
    drained = node_of(world, WORKER, 1)
    old_uid = world.pod(WORKER, 1)["metadata"]["uid"]  # type: ignore[index]
    world.cordon(drained)
    world.evict(WORKER, 1)
    for _ in range(3):  # however often the operator looks while the kubelet takes the checkpoint
        world.reconcile()
        world.tick(1)
    assert world.pod(WORKER, 1)["metadata"]["uid"] == old_uid  # type: ignore[index]  # no second incarnation
    assert all(d.grace_seconds != 0 for d in deletes(world, "train-worker-1"))
    assert events.STRANDED_POD_DELETED not in world.reasons() and events.NODE_LOST not in world.reasons()
    assert budget(world)["disruptions"] == 1 and budget(world)["failuresUsed"] == 0
    world.kubelets()  # the drained node's kubelet ends the pod after the checkpoint at SIGTERM
    world.settle(rounds=20)
    status = world.status()
    assert status["state"] == "Running" and node_of(world, WORKER, 1) != drained
    assert not status.get("nodeFaults") and not status.get("excludedNodes")
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (1, 0)
    # A disruption never grows the backoff series.
    assert budget(world).get("consecutiveFaults", 0) == 0


@pytest.mark.parametrize("key", sorted(disruptions.NODE_TAINTS))
def test_a_maintenance_taints_eviction_by_the_taint_manager_is_no_node_fault(key: str) -> None:
    world = running_world(nodes=2, node_count=3)
    tainted = node_of(world, WORKER, 1)
    world.taint(tainted, key, effect="NoExecute")
    world.reconcile()
    assert world.status()["restarts"]["podReplacement"] == 0  # the taint alone moves nothing
    world.evict(WORKER, 1, reason="DeletionByTaintManager")
    world.reconcile()
    world.kubelets()
    world.settle(rounds=20)
    assert not world.status().get("nodeFaults")
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (1, 0)
    assert node_of(world, WORKER, 1) != tainted


def test_the_taint_managers_eviction_for_another_taint_is_still_the_nodes_fault() -> None:
    world = running_world(nodes=2, node_count=3)
    node = node_of(world, WORKER, 1)
    world.evict(WORKER, 1, reason="DeletionByTaintManager")
    world.reconcile()
    assert [f["nodeName"] for f in world.status()["nodeFaults"]] == [node]


def test_a_spare_on_a_cordoned_node_is_not_taken_for_a_replacement() -> None:
    world = running_world(nodes=2, node_count=4, hotSpares=1)
    spare_node = node_of(world, SPARE, 0)
    world.cordon(spare_node)
    world.evict(WORKER, 1)
    world.reconcile()
    world.kubelets()
    world.settle(rounds=20)
    assert events.SPARE_USED not in world.reasons()
    assert node_of(world, WORKER, 1) != spare_node
    assert spare_node in excluded_by_affinity(world, WORKER, 1)


def test_a_worker_on_an_unfit_but_ready_node_is_deleted_gracefully_and_force_only_once_the_node_is_gone() -> (
    None
):
    world = running_world(nodes=2, node_count=3, failurePolicy={"nodeLossGraceSeconds": 10})
    node = node_of(world, WORKER, 1)
    world.nodes[node]["status"]["conditions"].append({"type": "KernelDeadlock", "status": "True"})
    world.reconcile()
    assert [d.grace_seconds for d in deletes(world, "train-worker-1")] == [None]
    # The node then stops answering: past the grace, nothing will end the pod but a force delete.
    world.node_not_ready(node)
    world.nodes[node]["status"]["conditions"].append({"type": "KernelDeadlock", "status": "True"})
    world.tick(11)
    world.reconcile()
    assert [d.grace_seconds for d in deletes(world, "train-worker-1")] == [None, 0]
    assert events.STRANDED_POD_DELETED in world.reasons()


def test_a_node_loss_right_after_a_drain_is_still_a_fault() -> None:
    world = running_world(nodes=2, node_count=4, failurePolicy={"nodeLossGraceSeconds": 10})
    drained = node_of(world, WORKER, 1)
    world.cordon(drained)
    world.evict(WORKER, 1)
    world.reconcile()
    world.kubelets()
    world.settle(rounds=20)
    lost = node_of(world, WORKER, 1)
    world.node_not_ready(lost)
    world.tick(11)
    world.settle(rounds=20)
    status = world.status()
    assert [(f["nodeName"], f["lastReason"]) for f in status["nodeFaults"]] == [(lost, "NodeUnreachable")]
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (1, 1)
    assert node_of(world, WORKER, 1) not in {drained, lost}


def test_a_spot_interruption_notice_moves_the_worker_at_once_as_a_disruption() -> None:
    world = running_world(nodes=2, node_count=3)
    doomed = node_of(world, WORKER, 1)
    world.taint(doomed, "aws-node-termination-handler/spot-itn", effect="NoSchedule")
    world.reconcile()
    assert [d.grace_seconds for d in deletes(world, "train-worker-1")] == [None]  # its kubelet ends it
    assert events.WORKER_MOVED in world.reasons()
    world.reconcile()  # the same pod, terminating: not deleted again
    assert len(deletes(world, "train-worker-1")) == 1
    world.kubelets()
    world.settle(rounds=20)
    assert node_of(world, WORKER, 1) != doomed and world.status()["state"] == "Running"
    assert not world.status().get("nodeFaults")
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (1, 0)
    assert world.reasons().count(events.WORKER_MOVED) == 1


def test_a_sites_spot_notice_label_moves_the_worker_at_once_and_its_maintenance_label_moves_nothing() -> None:
    world = running_world(nodes=2, node_count=4)
    world.health = NodeHealth(
        disruption_labels={"example.com/maintenance": ()},
        notice_labels={"example.com/spot-notice": ("true",)},
    )
    maintained, doomed = node_of(world, WORKER, 0), node_of(world, WORKER, 1)
    world.label(maintained, "example.com/maintenance", "kernel-upgrade")
    world.label(doomed, "example.com/spot-notice", "true")
    world.reconcile()
    assert not deletes(world, "train-worker-0")
    assert [d.grace_seconds for d in deletes(world, "train-worker-1")] == [None]  # its kubelet ends it
    assert world.reasons().count(events.WORKER_MOVED) == 1
    world.kubelets()
    world.settle(rounds=20)
    # The replacement avoids both nodes; neither is a fault; one disruption, no budget spent.
    assert {maintained, doomed} <= excluded_by_affinity(world, WORKER, 1)
    assert node_of(world, WORKER, 0) == maintained and world.status()["state"] == "Running"
    assert not world.status().get("nodeFaults") and not world.status().get("excludedNodes")
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (1, 0)


@pytest.mark.parametrize("signal", ["cordon", "karpenter.sh/disrupted"])
def test_with_move_on_notice_a_planned_disruption_moves_the_worker_before_the_eviction(signal: str) -> None:
    world = running_world(nodes=2, node_count=3, disruption={"moveOnNotice": True})
    node = node_of(world, WORKER, 1)
    if signal == "cordon":
        world.cordon(node)
    else:
        world.taint(node, signal, effect="NoSchedule")
    world.reconcile()
    assert [d.grace_seconds for d in deletes(world, "train-worker-1")] == [None]
    assert events.WORKER_MOVED in world.reasons()
    world.kubelets()
    world.settle(rounds=20)
    assert node_of(world, WORKER, 1) != node and not world.status().get("nodeFaults")
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (1, 0)


@pytest.mark.parametrize("key", sorted(disruptions.NODE_TAINTS - disruptions.MOVING_TAINTS))
def test_other_maintenance_taints_move_nothing_on_their_own(key: str) -> None:
    world = running_world(nodes=2, node_count=3)
    world.taint(node_of(world, WORKER, 1), key, effect="NoSchedule")
    world.settle()
    assert not deletes(world, "train-worker-1") and events.WORKER_MOVED not in world.reasons()


def _exit(code: int) -> Callable[[dict[str, Any]], None]:
    def change(pod: dict[str, Any]) -> None:
        state = {"terminated": {"exitCode": code, "reason": "Error"}}
        pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": state}]}

    return change


def test_a_worker_that_left_for_another_pods_drain_restarts_the_gang_as_a_disruption() -> None:
    # Under the Supervisor launcher a drained pod's peers exit PEER_DRAINED_EXIT_CODE: no fault of theirs.
    world = running_world(nodes=2, node_count=4)
    world.evict(WORKER, 1)
    world.reconcile()
    world.set_pod(WORKER, 0, _exit(termination.PEER_DRAINED_EXIT_CODE))
    world.reconcile()
    assert events.GANG_RESTART in world.reasons() and events.WORKER_FAILED not in world.reasons()
    assert (budget(world)["disruptions"], budget(world)["failuresUsed"]) == (2, 0)
    world.kubelets()
    world.settle(rounds=30)
    assert world.status()["state"] == "Running" and not world.status().get("nodeFaults")


def test_any_other_exit_code_is_still_the_workers_failure() -> None:
    world = running_world(nodes=2, node_count=4)
    world.set_pod(WORKER, 0, _exit(1))
    world.reconcile()
    assert events.WORKER_FAILED in world.reasons() and budget(world)["failuresUsed"] == 1


def drain_waiting(world: World) -> dict[str, str] | None:
    found: dict[str, str] | None = next(
        (c for c in world.status().get("conditions", []) if c["type"] == cond.COND_DRAIN_WAITING), None
    )
    return found


def test_without_a_disruption_budget_no_drain_waits() -> None:
    world = running_world(nodes=2, node_count=3)
    world.cordon(node_of(world, WORKER, 1))
    world.settle()
    assert drain_waiting(world) is None


def test_the_jobs_disruption_budget_holding_a_drain_is_said_in_status_once() -> None:
    world = running_world(nodes=2, node_count=3, disruption={"podDisruptionBudget": {"maxUnavailable": 0}})
    assert drain_waiting(world)["status"] == "False"  # type: ignore[index]
    node = node_of(world, WORKER, 1)
    world.cordon(node)
    world.settle()
    waiting = drain_waiting(world)
    assert waiting is not None and waiting["status"] == "True", waiting
    assert waiting["reason"] == cond.REASON_POD_DISRUPTION_BUDGET
    assert f"worker 1 on {node} (Cordoned)" in waiting["message"] and "train-workers" in waiting["message"]
    world.reconcile()
    assert world.reasons().count(cond.COND_DRAIN_WAITING) == 1
    world.nodes[node]["spec"]["unschedulable"] = False
    world.settle()
    assert drain_waiting(world)["status"] == "False"  # type: ignore[index]


def test_a_budget_holds_only_the_ready_workers_beyond_what_it_lets_go() -> None:
    world = running_world(nodes=2, node_count=3, disruption={"podDisruptionBudget": {"maxUnavailable": 1}})
    world.taint(node_of(world, WORKER, 1), "karpenter.sh/disrupted", effect="NoSchedule")
    world.settle()
    assert drain_waiting(world)["status"] == "False"  # type: ignore[index]
    world.cordon(node_of(world, WORKER, 0))
    world.settle()
    assert drain_waiting(world)["status"] == "True"  # type: ignore[index]  # two held, one allowed
    # A worker that is not Ready may be evicted anyway (unhealthyPodEvictionPolicy: AlwaysAllow), and it
    # uses up the budget: worker 1 alone is held.
    world.set_pod(WORKER, 0, lambda pod: pod["status"].update(conditions=[]))
    world.reconcile()
    waiting = drain_waiting(world)
    assert waiting is not None and waiting["status"] == "True"
    assert "worker 1 on" in waiting["message"] and "worker 0" not in waiting["message"]


def test_the_docs_table_is_the_codes_list_of_signals() -> None:
    table = disruptions.markdown_table()
    assert table in DOCS.read_text(), "docs/operations.md: paste `python -m rtj_operator.disruptions`"
    for signal in (*disruptions.NODE_SIGNALS, *disruptions.POD_SIGNALS):
        assert f"| `{signal.name}` | {signal.kind} |" in table
