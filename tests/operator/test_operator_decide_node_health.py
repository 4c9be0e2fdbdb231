"""Node health beyond Ready (nodehealth, decide.node_problems.node_problem): every setting of the judge, the
settings' parsing, and what a pass decides for a worker on a Ready node that shows a signal."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from operator_world import WORKER, node_of, running_world
from rtj_operator import disruptions, events, nodehealth, observe
from rtj_operator.decide import node_problems
from rtj_operator.nodehealth import NodeHealth, NodeHealthError, parse_node_health
from rtj_operator.progress import ProgressReport, parse_report

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
P5 = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "cpu": "192"}


def node(
    *,
    conditions: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    taints: list[tuple[str, str]] = (),  # type: ignore[assignment]
    unschedulable: bool = False,
    allocatable: dict[str, str] | None = None,
) -> observe.NodeState:
    body: dict[str, Any] = {
        "metadata": {"name": "n1", "labels": labels or {}},
        "spec": {"taints": [{"key": k, "effect": e} for k, e in taints], "unschedulable": unschedulable},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                *(
                    {"type": t, "status": s, "reason": "Why", "message": "what"}
                    for t, s in (conditions or {}).items()
                ),
            ],
            "allocatable": P5 if allocatable is None else allocatable,
        },
    }
    return observe.observe_node(body)


def pod(*, gpus: int = 8, efa: int = 32, report: dict[str, Any] | None = None) -> observe.PodState:
    limits = {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa), "memory": "1800Gi"}
    body: dict[str, Any] = {
        "metadata": {
            "name": "train-worker-0",
            "uid": "u0",
            "labels": {"resilient.training/role": "worker", "resilient.training/worker-index": "0"},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "trainer", "resources": {"limits": limits, "requests": {"cpu": "180"}}}],
        },
        "status": {"phase": "Running"},
    }
    parsed = observe.observe_pod(body, parse_report(json.dumps(report)) if report else None)
    assert parsed is not None
    return parsed


def read_report(payload: dict[str, Any]) -> ProgressReport:
    """A report as the operator reads it from a worker's progress endpoint."""
    parsed = parse_report(json.dumps(payload))
    assert parsed is not None
    return parsed


def judge(
    state: observe.NodeState, health: NodeHealth | None = None, worker: observe.PodState | None = None
) -> node_problems.NodeProblem | None:
    found, recheck = node_problems.node_problem(
        "n1", {"n1": state}, (), NOW, 10, health=health or NodeHealth(), pod=worker or pod()
    )
    assert recheck is None
    return found


# --- conditions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "unhealthy"),
    [*nodehealth.NPD_CONDITIONS.items(), *nodehealth.EKS_NODE_MONITORING_CONDITIONS.items()],
)
def test_every_default_condition_at_its_unhealthy_status_makes_the_node_unfit(
    kind: str, unhealthy: str
) -> None:
    problem = judge(node(conditions={kind: unhealthy}))
    assert problem is not None and problem.reason == kind
    assert f"{kind}={unhealthy}" in problem.message and "(Why: what)" in problem.message
    assert problem.permanent is (kind == "AcceleratedHardwareReady")
    healthy = "False" if unhealthy == "True" else "True"
    assert judge(node(conditions={kind: healthy})) is None


def test_conditions_setting_replaces_the_defaults() -> None:
    health = NodeHealth(conditions={"GPUMissing": "True"})
    assert judge(node(conditions={"KernelDeadlock": "True"}), health) is None
    problem = judge(node(conditions={"GPUMissing": "True"}), health)
    assert problem is not None and problem.reason == "GPUMissing" and not problem.permanent


def test_an_unknown_condition_status_is_unhealthy_only_when_configured() -> None:
    assert judge(node(conditions={"AcceleratedHardwareReady": "Unknown"})) is None
    health = NodeHealth(conditions={"AcceleratedHardwareReady": "Unknown"})
    assert judge(node(conditions={"AcceleratedHardwareReady": "Unknown"}), health) is not None


# --- labels -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", nodehealth.HYPERPOD_UNHEALTHY)
def test_hyperpod_health_label_values_make_the_node_unfit(value: str) -> None:
    problem = judge(node(labels={nodehealth.HYPERPOD_HEALTH_LABEL: value}))
    assert problem is not None and problem.reason == value
    assert problem.permanent is (value == "UnschedulablePendingReplacement")


def test_a_healthy_label_value_is_fine_and_an_empty_value_list_means_any_value() -> None:
    assert judge(node(labels={nodehealth.HYPERPOD_HEALTH_LABEL: "Schedulable"})) is None
    health = NodeHealth(labels={"example.com/gpu-unhealthy": ()})
    problem = judge(node(labels={"example.com/gpu-unhealthy": "whatever"}), health)
    assert problem is not None and problem.reason == "example.com/gpu-unhealthy"
    assert judge(node(labels={nodehealth.HYPERPOD_HEALTH_LABEL: "Unschedulable"}), health) is None


# --- taints -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", nodehealth.DEFAULT_TAINTS)
@pytest.mark.parametrize("effect", ["NoSchedule", "PreferNoSchedule"])
def test_default_taints_of_any_effect_make_the_node_unfit(key: str, effect: str) -> None:
    problem = judge(node(taints=[(key, effect)]))
    assert problem is not None and problem.reason == key and not problem.permanent


def test_taints_setting_replaces_the_defaults_and_other_noschedule_taints_are_fine() -> None:
    assert judge(node(taints=[("nvidia.com/gpu", "NoSchedule")])) is None
    health = NodeHealth(taints=("example.com/gpu-bad",))
    assert judge(node(taints=[(nodehealth.DEFAULT_TAINTS[0], "NoSchedule")]), health) is None
    assert judge(node(taints=[("example.com/gpu-bad", "NoSchedule")]), health) is not None


# --- planned disruptions: no health signal -------------------------------------------------------


@pytest.mark.parametrize("replace_on_cordon", [False, True])
def test_a_cordon_is_a_planned_disruption_not_a_health_signal_whatever_the_old_setting(
    replace_on_cordon: bool,
) -> None:
    cordoned = node(unschedulable=True)
    assert judge(cordoned, NodeHealth(replace_on_cordon=replace_on_cordon)) is None
    assert node_problems.node_disruption(cordoned, NodeHealth()) == disruptions.CORDONED
    assert node_problems.node_disruption(node(), NodeHealth()) is None


@pytest.mark.parametrize("key", sorted(disruptions.NODE_TAINTS))
@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_maintenance_taints_are_disruptions_even_when_listed_or_not_tolerated(key: str, effect: str) -> None:
    tainted = node(taints=[(key, effect)])
    listed = NodeHealth(taints=(key, *nodehealth.DEFAULT_TAINTS))
    assert judge(tainted, listed) is None
    assert node_problems.node_disruption(tainted, NodeHealth()) == key
    # Not tolerated, even NoExecute: no node problem (the taint manager's eviction is the disruption).
    found, recheck = node_problems.node_problem("n1", {"n1": tainted}, (), NOW, 10, health=NodeHealth())
    assert (found, recheck) == (None, None)


SITE_SIGNALS = NodeHealth(
    taints=("example.com/maintenance", *nodehealth.DEFAULT_TAINTS),
    labels={"example.com/maintenance": (), "example.com/gpu-unhealthy": ()},
    disruption_taints=("example.com/maintenance",),
    disruption_labels={"example.com/maintenance": ("planned",)},
    notice_taints=("example.com/reclaim",),
    notice_labels={"example.com/spot-notice": ("true",)},
)


@pytest.mark.parametrize(
    ("shown", "signal", "departs"),
    [
        (node(taints=[("example.com/maintenance", "NoExecute")]), "example.com/maintenance", False),
        (node(labels={"example.com/maintenance": "planned"}), "example.com/maintenance=planned", False),
        (node(taints=[("example.com/reclaim", "NoExecute")]), "example.com/reclaim", True),
        (node(labels={"example.com/spot-notice": "true"}), "example.com/spot-notice=true", True),
        (
            node(taints=[("aws-node-termination-handler/spot-itn", "NoSchedule")]),
            "aws-node-termination-handler/spot-itn",
            True,
        ),
    ],
)
def test_a_sites_own_disruption_and_notice_signals_are_planned_never_a_fault(
    shown: observe.NodeState, signal: str, departs: bool
) -> None:
    # Listed as health signals too (a label, a taint) and NoExecute, not tolerated: still no fault.
    found, recheck = node_problems.node_problem(
        "n1", {"n1": shown}, (), NOW, 10, health=SITE_SIGNALS, pod=pod()
    )
    assert (found, recheck) == (None, None)
    assert node_problems.node_disruption(shown, SITE_SIGNALS) == signal
    assert node_problems.node_departure(shown, SITE_SIGNALS) == (signal if departs else None)


def test_a_label_value_the_settings_do_not_list_is_no_signal_and_other_health_labels_still_are() -> None:
    other = node(labels={"example.com/spot-notice": "false", "example.com/maintenance": "done"})
    assert node_problems.node_disruption(other, SITE_SIGNALS) is None
    assert node_problems.node_departure(other, SITE_SIGNALS) is None
    # example.com/maintenance=done is no planned disruption, so the health label (any value) judges it.
    problem = judge(other, SITE_SIGNALS)
    assert problem is not None and problem.reason == "example.com/maintenance"
    # Without the settings a label means nothing.
    noticed = node(labels={"example.com/spot-notice": "true"})
    assert node_problems.node_disruption(noticed, NodeHealth()) is None
    assert node_problems.node_departure(noticed, NodeHealth()) is None


# --- allocatable ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocatable", "unfit"),
    [
        ({**P5, "nvidia.com/gpu": "7"}, True),  # a GPU fell off the bus
        ({**P5, "vpc.amazonaws.com/efa": "31"}, True),  # an EFA device is gone
        ({k: v for k, v in P5.items() if k != "nvidia.com/gpu"}, True),  # the device plugin is gone
        (P5, False),
        ({**P5, "nvidia.com/gpu": "16"}, False),
    ],
)
def test_allocatable_below_the_workers_request_makes_the_node_unfit(
    allocatable: dict[str, str], unfit: bool
) -> None:
    problem = judge(node(allocatable=allocatable))
    assert (problem is not None) is unfit
    if problem is not None:
        assert problem.reason == nodehealth.SIGNAL_INSUFFICIENT_ALLOCATABLE and problem.permanent
        assert "the worker requests" in problem.message


def test_allocatable_counts_only_for_the_listed_resources_a_worker_requests() -> None:
    fewer = node(allocatable={**P5, "nvidia.com/gpu": "7"})
    assert judge(fewer, NodeHealth(resources=("vpc.amazonaws.com/efa",))) is None
    assert judge(fewer, worker=pod(gpus=0, efa=0)) is None  # a CPU worker does not care
    assert judge(fewer, worker=pod(gpus=4)) is None


# --- the trainer's reports --------------------------------------------------------------------------


def report(count: int, node_name: str = "n1") -> dict[str, Any]:
    return {
        "v": 1,
        "step": 5,
        "nodeFaults": {"node": node_name, "count": count, "lastReason": "CUDA error: ECC"},
    }


@pytest.mark.parametrize(
    ("count", "threshold", "unfit"), [(2, 3, False), (3, 3, True), (9, 0, False), (1, 1, True)]
)
def test_faults_the_trainer_reports_past_the_threshold_make_the_node_unfit(
    count: int, threshold: int, unfit: bool
) -> None:
    health = NodeHealth(trainer_fault_threshold=threshold)
    problem = judge(node(), health, pod(report=report(count)))
    assert (problem is not None) is unfit
    if problem is not None:
        assert problem.reason == nodehealth.SIGNAL_TRAINER_REPORTED and problem.permanent
        assert "CUDA error: ECC" in problem.message


def test_faults_reported_for_another_node_do_not_count() -> None:
    assert judge(node(), worker=pod(report=report(5, node_name="n0"))) is None


# --- permanence, order, the classic problems first -----------------------------------------------------


def test_permanent_setting_decides_which_signals_exclude_at_once() -> None:
    health = NodeHealth(permanent=("KernelDeadlock",))
    assert judge(node(conditions={"KernelDeadlock": "True"}), health).permanent  # type: ignore[union-attr]
    assert not judge(node(conditions={"AcceleratedHardwareReady": "False"}), health).permanent  # type: ignore[union-attr]


def test_not_ready_within_grace_still_waits_and_health_is_judged_on_ready_nodes_too() -> None:
    state = observe.observe_node(
        {
            "metadata": {"name": "n1"},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T11:59:55Z"},
                    {"type": "KernelDeadlock", "status": "True"},
                ]
            },
        }
    )
    found, recheck = node_problems.node_problem(
        "n1", {"n1": state}, (), NOW, 10, health=NodeHealth(), pod=pod()
    )
    assert found is not None and found.reason == "KernelDeadlock" and recheck is None
    found, recheck = node_problems.node_problem("n1", {"n1": state}, (), NOW, 10)
    assert found is None and recheck is not None  # without health settings: as before


# --- the settings -----------------------------------------------------------------------------------


def test_empty_settings_are_the_defaults_and_omitted_keys_keep_theirs() -> None:
    assert parse_node_health(None) == parse_node_health("") == parse_node_health("{}") == NodeHealth()
    health = parse_node_health('{"replaceOnCordon": false, "labels": {}}')
    assert health.replace_on_cordon is False and health.labels == {}
    assert health.conditions == NodeHealth().conditions and health.permanent == nodehealth.DEFAULT_PERMANENT


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[]", "expected a JSON object"),
        ("{", "not JSON"),
        ('{"conditions": {"KernelDeadlock": "yes"}}', "nodeHealth.conditions.KernelDeadlock"),
        ('{"trainerFaultThreshold": -1}', "nodeHealth.trainerFaultThreshold"),
        ('{"taints": [""]}', "nodeHealth.taints[0]"),
        ('{"cordon": true}', "nodeHealth.cordon: unknown field"),
        (
            '{"noticeLabels": {"example.com/spot-notice": "true"}}',
            "nodeHealth.noticeLabels.example.com/spot-notice",
        ),
        ('{"disruptionTaints": [""]}', "nodeHealth.disruptionTaints[0]"),
    ],
)
def test_bad_settings_name_the_field(text: str, field: str) -> None:
    with pytest.raises(NodeHealthError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_node_health(text)


# --- what a pass decides ----------------------------------------------------------------------------


def _degrade(world: Any, name: str, kind: str, status: str) -> None:
    world.nodes[name]["status"]["conditions"].append({"type": kind, "status": status})


@pytest.mark.parametrize(
    ("kind", "status", "permanent"),
    [("AcceleratedHardwareReady", "False", True), ("KernelDeadlock", "True", False)],
)
def test_a_worker_on_a_ready_node_with_a_signal_is_replaced_and_the_node_recorded(
    kind: str, status: str, permanent: bool
) -> None:
    world = running_world()
    bad = node_of(world, WORKER, 1)
    _degrade(world, bad, kind, status)
    world.reconcile()
    recorded = world.status()
    assert recorded["restarts"]["podReplacement"] == 1
    fault = next(f for f in recorded["nodeFaults"] if f["nodeName"] == bad)
    assert (fault["count"], fault["lastReason"]) == (1, kind)
    assert [e["nodeName"] for e in recorded["excludedNodes"]] == ([bad] if permanent else [])
    assert events.NODE_LOST in world.reasons()
    world.settle()
    # Even when not excluded for good, the node is avoided while it shows the signal.
    assert node_of(world, WORKER, 1) not in {bad, node_of(world, WORKER, 0)}
    assert world.status()["state"] == "Running" and world.status()["restarts"]["podReplacement"] == 1


def test_reported_faults_below_the_threshold_are_recorded_without_a_replacement() -> None:
    world = running_world()
    name = node_of(world, WORKER, 1)
    pod_body = world.pod(WORKER, 1)
    assert pod_body is not None
    uid = pod_body["metadata"]["uid"]
    world.reports[uid] = read_report(report(2, name))
    world.reconcile()
    status = world.status()
    assert status["restarts"]["podReplacement"] == 0
    assert [(f["nodeName"], f["count"], f["reportedFaults"]) for f in status["nodeFaults"]] == [(name, 0, 2)]
    world.reports[uid] = read_report(report(3, name))
    world.reconcile()
    status = world.status()
    assert status["restarts"]["podReplacement"] == 1
    fault = status["nodeFaults"][0]
    assert (fault["count"], fault["reportedFaults"], fault["lastReason"]) == (
        1,
        3,
        nodehealth.SIGNAL_TRAINER_REPORTED,
    )
    assert [e["nodeName"] for e in status["excludedNodes"]] == [name]
