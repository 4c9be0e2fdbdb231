"""Failure handling and budgets (decide.failures): node loss, taints, exclusion, restart scope, budgets."""

from __future__ import annotations

import logging

import pytest
from operator_world import WORKER, node_of, running_world
from rtj_operator import constants, decide, events
from rtj_operator.runtime import job_pass


def test_node_not_ready_within_grace_waits_and_asks_to_be_woken() -> None:
    world = running_world(failurePolicy={"nodeLossGraceSeconds": 30})
    lost = node_of(world, WORKER, 1)
    world.node_not_ready(lost)
    world.tick(10)
    plan = world.reconcile()
    assert plan.actions == () and world.status()["restarts"]["podReplacement"] == 0
    assert plan.requeue_after == pytest.approx(20)


def test_node_not_ready_beyond_grace_replaces_the_worker_elsewhere() -> None:
    world = running_world(failurePolicy={"nodeLossGraceSeconds": 30})
    lost = node_of(world, WORKER, 1)
    world.node_not_ready(lost)
    world.tick(31)
    plan = world.reconcile()
    status = world.status()
    assert status["restarts"]["podReplacement"] == 1 and status["state"] == "Recovering"
    assert status["nodeFaults"][0]["nodeName"] == lost and status["nodeFaults"][0]["count"] == 1
    assert status["excludedNodes"] == []  # one fault is below the repeat-offender threshold (2)
    # The pod is stranded on a node no kubelet answers for: force-deleted, then replaced.
    assert any(isinstance(a, decide.DeletePod) and a.grace_seconds == 0 for a in plan.actions)
    assert events.NODE_LOST in world.reasons()
    world.settle()
    assert node_of(world, WORKER, 1) not in {lost, node_of(world, WORKER, 0)}
    assert world.status()["state"] == "Running"
    assert world.condition("Recovering")["reason"] == events.JOB_RECOVERED
    assert world.reasons().count(events.WORKER_REPLACED) == 1
    assert world.pod(WORKER, 1)["metadata"]["annotations"][constants.ANNOTATION_REPLACES] == lost  # type: ignore[index]


def test_a_pass_that_counts_a_fault_says_so_in_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """The operator's log names what a pass decided and the job's version it decided from; an idle
    pass logs nothing."""
    world = running_world(failurePolicy={"nodeLossGraceSeconds": 30})
    world.job["metadata"]["resourceVersion"] = "4711"
    caplog.set_level(logging.INFO, logger=job_pass.logger.name)
    job_pass.log_decision(world.job, world.plan())
    assert caplog.records == []
    world.node_not_ready(node_of(world, WORKER, 1))
    world.tick(31)
    job_pass.log_decision(world.job, world.plan())
    [record] = caplog.records
    assert record.getMessage().startswith("ml/train: from resourceVersion 4711: NodeLost: node ")
    # The stranded pod's force delete; its replacement follows in a later pass.
    assert record.getMessage().endswith("; 1 action(s)")


def test_untolerated_noexecute_taint_is_a_loss_at_once() -> None:
    world = running_world()
    lost = node_of(world, WORKER, 1)
    world.taint(lost, "example.com/maintenance")
    world.reconcile()
    assert world.status()["restarts"]["podReplacement"] == 1
    assert world.status()["nodeFaults"][0]["lastReason"] == "NodeTainted"


def test_unreachable_taint_waits_for_the_grace_period() -> None:
    world = running_world(failurePolicy={"nodeLossGraceSeconds": 20})
    lost = node_of(world, WORKER, 1)
    world.taint(lost, "node.kubernetes.io/unreachable")
    assert world.reconcile().actions == ()
    world.tick(21)
    world.reconcile()
    assert world.status()["nodeFaults"][0]["lastReason"] == "NodeUnreachable"


def test_deleted_node_is_excluded_at_once() -> None:
    world = running_world()
    lost = node_of(world, WORKER, 1)
    del world.nodes[lost]
    world.reconcile()
    status = world.status()
    assert (
        status["excludedNodes"][0]["nodeName"] == lost
        and status["excludedNodes"][0]["reason"] == "NodeDeleted"
    )
    assert events.NODE_EXCLUDED in world.reasons()
    world.settle()
    affinity = world.pod(WORKER, 1)["spec"]["affinity"]["nodeAffinity"]  # type: ignore[index]
    assert lost in str(affinity)  # kept off the lost node by affinity NotIn


def test_repeat_offender_is_excluded_and_optionally_tainted() -> None:
    world = running_world(failurePolicy={"taintExcludedNodes": True, "backoffSeconds": 0})
    flaky = node_of(world, WORKER, 1)
    world.taint(flaky, "example.com/flaky")
    world.reconcile()
    world.nodes[flaky]["spec"]["taints"] = []
    # Bring the worker back onto the flaky node (the scheduler would pick it again).
    world.settle()
    pod = world.pod(WORKER, 1)
    assert pod is not None
    world.pods[pod["metadata"]["name"]]["spec"]["nodeName"] = flaky
    world.reconcile()
    world.taint(flaky, "example.com/flaky")
    plan = world.reconcile()
    status = world.status()
    assert status["nodeFaults"][0]["count"] == 2
    assert [e["nodeName"] for e in status["excludedNodes"]] == [flaky]
    assert status["excludedNodes"][0]["reason"] == "RepeatOffender"
    taints = [a for a in plan.actions if isinstance(a, decide.TaintNode)]
    assert taints == [decide.TaintNode(flaky, constants.TAINT_EXCLUDED, "train", "NoSchedule")]


def test_worker_pod_failed_on_healthy_node_is_a_gang_restart() -> None:
    world = running_world(nodes=3, node_count=4)
    world.set_pod(WORKER, 2, lambda p: p.update(status={"phase": "Failed", "message": "ft_launcher gave up"}))
    first_uids = {p["metadata"]["uid"] for p in world.pods.values()}
    world.reconcile()
    assert world.status()["restarts"]["podReplacement"] == 1
    assert events.GANG_RESTART in world.reasons() and events.WORKER_FAILED in world.reasons()
    assert [e["state"] for e in world.status()["workers"]["pods"]] == ["Replacing"] * 3
    world.settle()
    assert world.status()["state"] == "Running"
    assert not first_uids & {p["metadata"]["uid"] for p in world.pods.values()}  # every pod is new
    assert world.status()["nodeFaults"] == []  # the node was not to blame


def test_evicted_worker_is_replaced_alone() -> None:
    world = running_world(nodes=3, node_count=4)
    survivor = world.pod(WORKER, 2)["metadata"]["uid"]  # type: ignore[index]

    def evict(pod: dict[str, object]) -> None:
        pod["status"] = {
            "phase": "Failed",
            "reason": "Evicted",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        }

    world.set_pod(WORKER, 1, evict)
    world.reconcile()
    assert events.WORKER_DISRUPTED in world.reasons() and events.GANG_RESTART not in world.reasons()
    world.settle()
    assert world.pod(WORKER, 2)["metadata"]["uid"] == survivor  # type: ignore[index]
    assert world.status()["restarts"]["podReplacement"] == 1


def test_worker_deleted_by_someone_else_is_replaced() -> None:
    world = running_world()
    del world.pods["train-worker-1"]
    world.reconcile()
    assert world.status()["restarts"]["podReplacement"] == 1
    world.settle()
    assert world.pod(WORKER, 1) is not None and world.status()["state"] == "Running"


def test_losing_worker_zero_restarts_the_gang() -> None:
    world = running_world(nodes=3, node_count=5)
    world.taint(node_of(world, WORKER, 0), "example.com/broken")
    survivor_uid = world.pod(WORKER, 2)["metadata"]["uid"]  # type: ignore[index]
    world.reconcile()
    assert events.GANG_RESTART in world.reasons()
    world.settle()
    assert world.pod(WORKER, 2)["metadata"]["uid"] != survivor_uid  # type: ignore[index]
    assert world.status()["restarts"]["podReplacement"] == 1


def test_budget_exhausted_fails_the_job_and_deletes_workers_but_not_data() -> None:
    world = running_world(failurePolicy={"maxNodeReplacements": 1, "backoffSeconds": 0})
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    assert world.status()["restarts"]["podReplacement"] == 1
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    status = world.status()
    assert status["state"] == "Failed"
    assert world.condition("Failed")["reason"] == events.RESTART_BUDGET_EXHAUSTED
    assert status["restarts"]["podReplacement"] == 1 and status["completionTime"]
    assert world.pods == {}
    assert ("PersistentVolumeClaim", "train-checkpoints") in world.others
