"""Capacity (decide.capacity): whether enough nodes could ever hold a worker, before any pod is made."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from operator_world import World, job_body
from rtj_operator import constants, events, observe, render
from rtj_operator.api import parse_job
from rtj_operator.decide import capacity
from rtj_operator.decide import conditions as cond

GPU_NODE = {"cpu": "192", "memory": "2000Gi", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32",
            "hugepages-2Mi": "5120Mi", "pods": "110"}  # fmt: skip


def node(name: str, *, instance: str = "p5.48xlarge", allocatable: dict[str, str] | None = None,
         labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         unschedulable: bool = False) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, constants.LABEL_INSTANCE_TYPE: instance}
            | (labels or {}),
        },
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": dict(GPU_NODE if allocatable is None else allocatable),
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def worker(excluded: tuple[str, ...] = (), **spec: Any) -> dict[str, Any]:
    body = job_body(nodes=1, instanceType="p5.48xlarge", **spec)
    return render.render_worker_pod(parse_job(body), 0, uid="u", excluded_nodes=excluded)


CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    ("fits", {}, node("n"), None),
    ("cordoned", {}, node("n", unschedulable=True), "unschedulable"),
    ("another instance type", {}, node("n", instance="p4d.24xlarge"), "of another instance type"),
    ("excluded", {"excluded": ("n",)}, node("n"), "excluded (faults, NotReady)"),
    ("nodeSelector", {"scheduling": {"nodeSelector": {"pool": "a"}}}, node("n", labels={"pool": "b"}),
     "not matching nodeSelector"),
    ("nodeSelector matches", {"scheduling": {"nodeSelector": {"pool": "a"}}}, node("n", labels={"pool": "a"}),
     None),
    ("user affinity term",
     {"scheduling": {"requiredNodeAffinityTerms": [
         {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}},
     node("n", labels={"zone": "z2"}), "not matching the node affinity terms"),
    ("untolerated taint", {}, node("n", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
     "with untolerated taint dedicated"),
    ("gpu taint tolerated", {}, node("n", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), None),
    ("PreferNoSchedule ignored", {}, node("n", taints=[{"key": "k", "effect": "PreferNoSchedule"}]), None),
    ("too few GPUs", {}, node("n", allocatable={**GPU_NODE, "nvidia.com/gpu": "4"}),
     "with too little allocatable nvidia.com/gpu"),
    ("no EFA", {}, node("n", allocatable={k: v for k, v in GPU_NODE.items() if k != "vpc.amazonaws.com/efa"}),
     "with too little allocatable vpc.amazonaws.com/efa"),
    ("hugepages", {}, node("n", allocatable={**GPU_NODE, "hugepages-2Mi": "2Gi"}),
     "with too little allocatable hugepages-2Mi"),
    ("memory in other units", {}, node("n", allocatable={**GPU_NODE, "memory": "1900000000Ki"}), None),
    ("cpu", {}, node("n", allocatable={**GPU_NODE, "cpu": "96"}), "with too little allocatable cpu"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "body", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fit_names_why_a_node_cannot_hold_a_worker(
    spec: dict[str, Any], body: dict[str, Any], cause: str | None
) -> None:
    excluded = spec.pop("excluded", ())
    found = capacity.fit(worker(excluded, **spec), [observe.observe_node(body)])
    if cause is None:
        assert found.fitting == 1 and found.causes == {}
    else:
        assert found.fitting == 0 and found.causes == {cause: 1}


def test_quantities() -> None:
    assert capacity.quantity("250m") == Fraction(1, 4)
    assert capacity.quantity("2Gi") == 2 * 2**30
    assert capacity.quantity("1.5k") == 1500
    assert capacity.quantity("1e3") == 1000
    assert capacity.quantity("x") is None


def big_world(nodes: int, node_count: int) -> World:
    return World.with_nodes(job_body(nodes=nodes), node_count)


def test_a_job_that_can_never_fit_creates_no_pods_and_says_why() -> None:
    world = big_world(1000, 4)
    world.nodes["node-3"]["spec"]["unschedulable"] = True
    world.nodes["node-2"]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE] = "p5.48xlarge"
    world.settle()
    assert world.pods == {} and world.creates() == 0
    blocked = world.condition(cond.COND_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("True", events.INSUFFICIENT_NODES)
    assert blocked["message"] == (
        "1000 nodes needed for the workers, 2 can hold one; the others: 1 of another instance type, "
        "1 unschedulable"
    )
    assert world.reasons().count(events.INSUFFICIENT_NODES) == 1  # not repeated on every pass
    assert world.status()["state"] == "Blocked"


def test_nodes_joining_unblock_the_job() -> None:
    world = big_world(3, 2)
    world.settle()
    assert world.pods == {} and world.condition(cond.COND_BLOCKED)["status"] == "True"
    world.nodes["node-2"] = World.with_nodes(job_body(), 3).nodes["node-2"]
    world.settle()
    assert world.status()["state"] == "Running" and len(world.pods) == 3
    blocked = world.condition(cond.COND_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("False", cond.REASON_NOT_BLOCKED)


def test_a_job_that_fits_gets_no_blocked_condition() -> None:
    world = big_world(2, 2)
    world.settle()
    assert world.status()["state"] == "Running"
    assert all(c["type"] != cond.COND_BLOCKED for c in world.status()["conditions"])
    assert world.creates() == 2
