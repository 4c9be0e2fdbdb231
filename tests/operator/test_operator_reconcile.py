"""Decision tables for the pure reconcile: node loss, pod failures, scope, spares, budgets, lifecycle."""

from __future__ import annotations

import pytest
from operator_world import T0, World, job_body, node_body
from rtj_operator import constants, decide, events
from rtj_operator.progress import format_time

WORKER, SPARE = constants.ROLE_WORKER, constants.ROLE_SPARE


def running_world(nodes: int = 2, node_count: int = 4, **spec: object) -> World:
    world = World.with_nodes(job_body(nodes=nodes, **spec), node_count)
    world.settle()
    assert world.status()["state"] == "Running"
    world.events.clear()
    return world


def node_of(world: World, role: str, index: int) -> str:
    pod = world.pod(role, index)
    assert pod is not None
    return str(pod["spec"]["nodeName"])


def test_create_renders_every_child_and_records_workers() -> None:
    world = World.with_nodes(job_body(nodes=3, hotSpares=1), 5)
    plan = world.reconcile()
    kinds = [a.kind for a in plan.actions if isinstance(a, decide.CreateObject)]
    # The Service, storage and RBAC come before the pods that need them.
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PersistentVolumeClaim",
        "Service",
        "Pod",
        "Pod",
        "Pod",
        "Pod",
    ]
    assert [e["state"] for e in world.status()["workers"]["pods"]] == ["Creating"] * 4
    assert world.status()["state"] == "Pending"
    assert world.status()["startTime"] == format_time(T0)
    world.settle()
    status = world.status()
    assert status["state"] == "Running"
    assert status["workers"]["readyText"] == "3/3" and status["workers"]["readySpares"] == 1
    assert world.condition("Ready")["reason"] == events.REASON_ALL_WORKERS_READY


def test_an_idle_job_needs_no_writes() -> None:
    world = running_world()
    for _ in range(3):
        world.tick(60)
        plan = world.reconcile()
        assert plan.actions == () and not plan.status_changed and plan.events == ()


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


def test_hot_spare_node_is_used_for_the_replacement_and_the_spare_replenished() -> None:
    world = running_world(nodes=2, node_count=4, hotSpares=1)
    spare_node = node_of(world, SPARE, 0)
    world.taint(node_of(world, WORKER, 1), "example.com/broken")
    world.settle()
    assert node_of(world, WORKER, 1) == spare_node
    assert events.SPARE_USED in world.reasons()
    assert world.pod(SPARE, 0) is not None and node_of(world, SPARE, 0) != spare_node
    assert world.status()["workers"]["readySpares"] == 1


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


def test_suspend_deletes_pods_keeps_storage_and_resume_recreates() -> None:
    world = running_world(hotSpares=1)
    world.job["spec"]["suspend"] = True
    world.job["metadata"]["generation"] = 2
    world.settle()
    assert world.pods == {} and world.status()["state"] == "Suspended"
    assert world.condition("Suspended")["status"] == "True" and events.SUSPENDED in world.reasons()
    assert world.status()["observedGeneration"] == 2
    world.job["spec"]["suspend"] = False
    world.settle()
    assert world.status()["state"] == "Running" and len(world.pods) == 3
    assert world.condition("Suspended")["reason"] == events.RESUMED
    assert world.status()["restarts"]["podReplacement"] == 0


def test_success_when_every_worker_succeeded_then_ttl_deletes_the_job() -> None:
    world = running_world(hotSpares=1, ttlSecondsAfterFinished=60)
    for i in range(2):
        world.set_pod(WORKER, i, lambda p: p.update(status={"phase": "Succeeded"}))
    world.reconcile()
    status = world.status()
    assert status["state"] == "Succeeded" and status["completionTime"] == format_time(world.now)
    assert events.JOB_SUCCEEDED in world.reasons()
    world.kubelets()
    assert world.pod(SPARE, 0) is None  # spares are not needed any more
    world.tick(30)
    plan = world.reconcile()
    assert not world.job_deleted and plan.requeue_after == pytest.approx(30)
    world.tick(31)
    world.reconcile()
    assert world.job_deleted


def test_deleting_a_retained_job_keeps_the_volume_and_delete_policy_removes_it() -> None:
    retained = World.with_nodes(job_body(), 2).view()
    assert decide.finalize(retained, {}) == ()
    deleting = World.with_nodes(
        job_body(checkpoint={"retentionPolicy": "Delete", "storage": {"dynamic": {}}}), 2
    )
    actions = decide.finalize(deleting.view(), {"n1": [(constants.TAINT_EXCLUDED, "train", "NoSchedule")]})
    assert decide.DeleteObject("v1", "PersistentVolumeClaim", "train-checkpoints", "ml") in actions
    assert decide.TaintNode("n1", constants.TAINT_EXCLUDED, "train", "NoSchedule", remove=True) in actions


def test_invalid_spec_sets_a_naming_condition_once() -> None:
    status, changed, emitted = decide.reconcile_invalid({}, 3, "spec.nodes: must be >= 1", T0)
    assert changed and emitted[0].reason == events.INVALID_SPEC and emitted[0].type == events.WARNING
    ready = status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert ready["message"] == "spec.nodes: must be >= 1"
    again = decide.reconcile_invalid(status, 3, "spec.nodes: must be >= 1", T0)
    assert again[1] is False and again[2] == ()


def test_condition_transition_time_moves_only_on_flips() -> None:
    conditions: list[dict[str, object]] = []
    decide.set_condition(conditions, "Ready", status=False, reason="A", message="a", now=T0, generation=1)
    later = T0.replace(hour=13)
    decide.set_condition(conditions, "Ready", status=False, reason="B", message="b", now=later, generation=2)
    assert conditions[0]["lastTransitionTime"] == format_time(T0) and conditions[0]["reason"] == "B"
    decide.set_condition(conditions, "Ready", status=True, reason="C", message="c", now=later, generation=2)
    assert conditions[0]["lastTransitionTime"] == format_time(later)


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
