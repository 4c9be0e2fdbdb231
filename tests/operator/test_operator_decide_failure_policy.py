"""The failure policy (spec.failurePolicy rules, budgets, backoff) as the pure decisions apply it.

Each test drives the in-memory world (`operator_world`): the real observe, reconcile and render code on
API-shaped objects, with the scheduler and kubelets played in explicit steps.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from operator_world import SPARE, WORKER, World, node_body, node_of, running_world, uids
from rtj_operator import decide, events
from rtj_operator.decide import placement
from rtj_operator.decide.state import PassState


def exited(code: int, message: str = "", reason: str = "Error") -> dict[str, Any]:
    """A worker pod whose container exited with `code` (terminationMessagePolicy FallbackToLogsOnError)."""
    terminated = {"exitCode": code, "reason": reason, "message": message}
    return {
        "phase": "Failed",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}],
    }


def disrupted(reason: str, status_reason: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason}],
    }
    if status_reason:
        status["reason"] = status_reason
    return status


def fail_worker(world: World, index: int, status: dict[str, Any]) -> None:
    world.set_pod(WORKER, index, lambda p: p.update(status=status))


def budget(world: World) -> dict[str, Any]:
    result: dict[str, Any] = world.status().get("budget", {})
    return result


# -- rules -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requirement", "code", "fails"),
    [
        ({"operator": "In", "values": [3, 4]}, 3, True),
        ({"operator": "In", "values": [3, 4]}, 1, False),
        ({"operator": "NotIn", "values": [137]}, 1, True),
        ({"operator": "NotIn", "values": [137]}, 137, False),
    ],
)
def test_exit_code_rule_fails_the_job_at_once(requirement: dict[str, Any], code: int, fails: bool) -> None:
    world = running_world(failurePolicy={"rules": [{"action": "FailJob", "onExitCodes": requirement}]})
    fail_worker(world, 1, exited(code, "ValueError: bad config"))
    world.reconcile()
    status = world.status()
    if fails:
        assert status["state"] == "Failed"
        failed = world.condition("Failed")
        assert failed["reason"] == events.FAILED_BY_RULE and "rule 0" in failed["message"]
        assert status["restarts"]["podReplacement"] == 0
        assert all(p["metadata"].get("deletionTimestamp") for p in world.pods.values())
        assert events.GANG_RESTART not in world.reasons()
    else:
        assert status["state"] == "Recovering" and events.GANG_RESTART in world.reasons()


def test_trainer_fault_reason_from_the_termination_message_selects_a_rule() -> None:
    rules = [{"action": "FailJob", "onFaultReasons": ["DataCorruption"]}]
    world = running_world(failurePolicy={"rules": rules})
    fail_worker(world, 0, exited(1, "Traceback ...\nFaultReason: DataCorruption\n"))
    world.reconcile()
    assert world.status()["state"] == "Failed"
    # The container runtime's reason (OOMKilled) is the fault reason when the trainer names none.
    world = running_world(failurePolicy={"rules": [{"action": "FailJob", "onFaultReasons": ["OOMKilled"]}]})
    fail_worker(world, 1, exited(137, reason="OOMKilled"))
    world.reconcile()
    assert world.condition("Failed")["reason"] == events.FAILED_BY_RULE


def test_exit_code_rules_never_match_a_node_loss() -> None:
    world = running_world(
        failurePolicy={"rules": [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [1]}}]}
    )
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.reconcile()
    assert world.status()["state"] == "Recovering"


def test_ignore_rule_replaces_but_counts_against_no_budget() -> None:
    rules = [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}}]
    world = running_world(failurePolicy={"rules": rules, "maxNodeReplacements": 0, "backoffSeconds": 0})
    for _ in range(3):
        fail_worker(world, 1, exited(42))
        world.settle()
        assert world.status()["state"] == "Running"
    status = world.status()
    assert status["restarts"]["podReplacement"] == 3
    assert budget(world)["ignored"] == 3 and budget(world)["failuresUsed"] == 0
    assert budget(world)["consecutiveFaults"] == 0  # no backoff series either
    assert world.reasons().count(events.FAULT_IGNORED) == 3
    # Ignore keeps the class's recovery: a process failure still restarts the gang.
    assert world.reasons().count(events.GANG_RESTART) == 3


def test_restart_job_rule_gangs_a_disruption() -> None:
    rules = [{"action": "RestartJob", "onDisruptionReasons": ["PreemptionByScheduler"]}]
    world = running_world(nodes=3, node_count=5, failurePolicy={"rules": rules})
    before = uids(world)
    fail_worker(world, 2, disrupted("PreemptionByScheduler", "Preempting"))
    world.reconcile()
    assert events.GANG_RESTART in world.reasons()
    assert [e["state"] for e in world.status()["workers"]["pods"]] == ["Replacing"] * 3
    world.settle()
    assert world.status()["state"] == "Running"
    assert not set(before.values()) & set(uids(world).values())


def test_replace_worker_rule_keeps_the_survivors_of_a_process_failure() -> None:
    rules = [{"action": "ReplaceWorker", "onExitCodes": {"operator": "In", "values": [75]}}]
    world = running_world(nodes=3, node_count=5, failurePolicy={"rules": rules})
    before = uids(world)
    fail_worker(world, 2, exited(75))
    world.settle()
    after = uids(world)
    assert events.GANG_RESTART not in world.reasons()
    assert after["train-worker-0"] == before["train-worker-0"]
    assert after["train-worker-2"] != before["train-worker-2"]


# -- classes and budgets -----------------------------------------------------------------------------------


def test_disruptions_are_counted_apart_and_spend_no_failure_budget() -> None:
    world = running_world(failurePolicy={"maxNodeReplacements": 0, "backoffSeconds": 0})
    fail_worker(world, 1, disrupted("EvictionByEvictionAPI", "Evicted"))
    world.settle()
    assert world.status()["state"] == "Running"
    assert world.status()["restarts"]["podReplacement"] == 1
    assert budget(world)["disruptions"] == 1 and budget(world)["failuresUsed"] == 0
    # countDisruptions: the same eviction spends the (empty) failure budget.
    world = running_world(failurePolicy={"maxNodeReplacements": 0, "countDisruptions": True})
    fail_worker(world, 1, disrupted("EvictionByEvictionAPI", "Evicted"))
    world.reconcile()
    assert world.condition("Failed")["reason"] == events.RESTART_BUDGET_EXHAUSTED


def test_class_budget_counts_only_faults_inside_its_window() -> None:
    budgets = [{"faultClass": "NodeLoss", "maxRestarts": 1, "windowSeconds": 100}]
    world = running_world(nodes=2, node_count=8, failurePolicy={"budgets": budgets, "backoffSeconds": 0})

    def lose_worker_one() -> None:
        world.taint(node_of(world, WORKER, 1), "example.com/broken")
        world.settle()

    lose_worker_one()
    assert world.status()["state"] == "Running"
    assert [f["faultClass"] for f in budget(world)["recentFaults"]] == ["NodeLoss"]
    world.tick(101)  # the first loss leaves the window
    lose_worker_one()
    assert world.status()["state"] == "Running"
    assert len(budget(world)["recentFaults"]) == 1  # the old one was forgotten
    world.tick(50)
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.reconcile()
    failed = world.condition("Failed")
    assert failed["reason"] == events.RESTART_BUDGET_EXHAUSTED
    assert "NodeLoss faults within 100 s" in failed["message"]


def test_class_budget_leaves_other_classes_alone() -> None:
    budgets = [{"faultClass": "ProcessFailure", "maxRestarts": 0}]
    world = running_world(failurePolicy={"budgets": budgets})
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    assert world.status()["state"] == "Running"
    fail_worker(world, 1, exited(1))
    world.reconcile()
    assert "ProcessFailure faults" in world.condition("Failed")["message"]


# -- backoff -----------------------------------------------------------------------------------------------


def backoff_seconds(world: World, consecutive: int) -> float:
    run = PassState.begin(world.view(), world.observed(), world.now)
    run.budget.consecutive_faults = consecutive
    return placement.backoff_delay(run).total_seconds()


def test_backoff_doubles_per_consecutive_fault_and_is_capped() -> None:
    world = running_world(failurePolicy={"backoffSeconds": 10, "maxBackoffSeconds": 35})
    assert [backoff_seconds(world, n) for n in range(1, 7)] == [10, 10, 20, 35, 35, 35]


def run_until_running(world: World, rounds: int = 40) -> None:
    """Operator, scheduler and kubelets, waking when the plan asks (a backoff), until Running."""
    for _ in range(rounds):
        plan = world.reconcile()
        world.schedule()
        world.kubelets()
        if world.status()["state"] == "Running":
            return
        world.tick(plan.requeue_after or 1)
    raise AssertionError(f"not Running: {world.status()['conditions']}")


def test_consecutive_faults_grow_the_wait_and_a_healthy_period_resets_it() -> None:
    policy = {"backoffSeconds": 10, "maxBackoffSeconds": 1000, "backoffResetSeconds": 300}
    world = running_world(nodes=2, node_count=8, failurePolicy=policy)
    waits = []
    for _ in range(3):
        world.taint(node_of(world, WORKER, 1), "example.com/broken")
        plan = world.reconcile()
        waits.append(plan.requeue_after)
        run_until_running(world)
    # The first replacement goes at once; later ones wait 10 s, then 20 s, from the newest one.
    assert waits[0] is None and waits[1] is not None and waits[2] is not None
    assert budget(world)["consecutiveFaults"] == 3
    assert waits[1] <= 10 < waits[2] <= 20
    world.tick(301)  # Ready for longer than backoffResetSeconds
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.reconcile()
    assert budget(world)["consecutiveFaults"] == 1


# -- worker 0's node loss ------------------------------------------------------------------------------------


def test_a_failure_while_a_peer_node_is_in_doubt_waits_and_is_filed_as_that_node_loss() -> None:
    world = running_world(failurePolicy={"nodeLossGraceSeconds": 20, "repeatOffenderThreshold": 1})
    lost = node_of(world, WORKER, 0)
    world.node_not_ready(lost)
    fail_worker(world, 1, exited(1, "RendezvousConnectionError"))  # lost the store on worker 0
    plan = world.reconcile()
    assert plan.actions == () and world.status()["restarts"]["podReplacement"] == 0
    assert plan.requeue_after == pytest.approx(20)
    world.tick(21)
    plan = world.reconcile()
    status = world.status()
    assert events.NODE_LOST in world.reasons()
    assert [f["nodeName"] for f in status["nodeFaults"]] == [lost]
    assert [e["nodeName"] for e in status["excludedNodes"]] == [lost]
    assert status["restarts"]["podReplacement"] == 1 and plan.counters["node_losses"] == 1
    assert any(isinstance(a, decide.DeletePod) and a.grace_seconds == 0 for a in plan.actions)


def test_worker_zero_node_found_lost_after_the_gang_restart_is_recorded_and_its_pod_force_deleted() -> None:
    world = running_world(failurePolicy={"nodeLossGraceSeconds": 5, "repeatOffenderThreshold": 1})
    lost = node_of(world, WORKER, 0)
    # The survivor fails first: the node still looks Ready (its lease has not expired yet).
    fail_worker(world, 1, exited(1, "RendezvousConnectionError"))
    world.reconcile()
    assert events.WORKER_FAILED in world.reasons() and world.status()["nodeFaults"] == []
    old_zero = world.pod(WORKER, 0)
    assert old_zero is not None and old_zero["metadata"].get("deletionTimestamp")  # graceful: hangs
    world.node_not_ready(lost)
    world.tick(6)
    plan = world.reconcile()
    status = world.status()
    assert world.reasons().count(events.NODE_LOST) == 1
    assert [f["nodeName"] for f in status["nodeFaults"]] == [lost]
    assert [e["nodeName"] for e in status["excludedNodes"]] == [lost]
    assert plan.counters["node_losses"] == 1
    assert status["restarts"]["podReplacement"] == 1  # charged once, by the restart
    assert decide.DeletePod(old_zero["metadata"]["name"], old_zero["metadata"]["uid"], 0) in plan.actions
    world.settle(rounds=20)
    assert world.status()["state"] == "Running" and world.reasons().count(events.NODE_LOST) == 1
    assert lost not in {p["spec"]["nodeName"] for p in world.pods.values()}


# -- spares ------------------------------------------------------------------------------------------------


def test_a_refilled_spare_is_not_barred_from_a_node_that_was_only_not_ready() -> None:
    world = running_world(nodes=2, node_count=3, hotSpares=1, failurePolicy={"nodeLossGraceSeconds": 5})
    spare_node = node_of(world, SPARE, 0)
    world.node_not_ready(spare_node)
    world.tick(6)
    world.settle(rounds=3)  # the spare is force-deleted and a new one waits: no other node is free
    spare = world.pod(SPARE, 0)
    assert spare is not None and not spare["spec"].get("nodeName")
    assert spare_node not in str(spare["spec"]["affinity"]["nodeAffinity"])
    world.node_ready(spare_node)
    world.settle()
    assert node_of(world, SPARE, 0) == spare_node
    assert world.status()["workers"]["readySpares"] == 1


def test_window_budget_survives_an_operator_restart_in_status() -> None:
    budgets = [{"faultClass": "NodeLoss", "maxRestarts": 1, "windowSeconds": 600}]
    world = running_world(nodes=2, node_count=6, failurePolicy={"budgets": budgets, "backoffSeconds": 0})
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    recorded = budget(world)["recentFaults"][0]["time"]
    # A fresh operator reads the same status: the fault is still inside the window.
    world.tick(timedelta(minutes=5).total_seconds())
    world.nodes["late"] = node_body("late", since=world.now)
    world.taint(node_of(world, WORKER, 0), "example.com/broken")
    world.reconcile()
    assert world.condition("Failed")["reason"] == events.RESTART_BUDGET_EXHAUSTED
    assert budget(world)["recentFaults"][0]["time"] == recorded


def test_a_failure_caused_by_a_peers_node_loss_is_not_judged_by_the_rules() -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}}]
    world = running_world(failurePolicy={"rules": rules, "nodeLossGraceSeconds": 5})
    world.node_not_ready(node_of(world, WORKER, 0))
    fail_worker(world, 1, exited(1, "RendezvousConnectionError"))
    world.tick(6)
    world.reconcile()
    assert world.status()["state"] == "Recovering"
    assert events.GANG_RESTART in world.reasons() and events.FAILED_BY_RULE not in world.reasons()
    assert world.status()["restarts"]["podReplacement"] == 1
