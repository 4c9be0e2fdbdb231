"""Random sequences of faults, with the operator crashing at random points between them: invariants
hold at every step and the job always ends either Running on healthy, non-excluded nodes or Failed
with its budget exhausted."""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st
from operator_world import World, job_body, node_body
from rtj_operator import constants, decide

FAULTS = ("taint", "delete-node", "not-ready", "fail-pod", "evict", "delete-pod", "heal", "add-node")


def inject(world: World, fault: str, rng: random.Random) -> None:
    pods = sorted(world.pods)
    scheduled = [p for p in pods if world.pods[p]["spec"].get("nodeName")]
    if fault == "add-node" or not scheduled:
        name = f"extra-{len(world.nodes)}-{rng.randrange(10**6)}"
        world.nodes[name] = node_body(name, since=world.now)
        return
    pod = world.pods[rng.choice(scheduled)]
    node = pod["spec"]["nodeName"]
    if fault == "taint" and node in world.nodes:
        world.taint(node, f"example.com/fault-{rng.randrange(100)}")
    elif fault == "delete-node":
        world.nodes.pop(node, None)
    elif fault == "not-ready" and node in world.nodes:
        world.node_not_ready(node)
    elif fault == "fail-pod":
        pod["status"] = {"phase": "Failed", "message": "exit 1"}
    elif fault == "evict":
        pod["status"] = {
            "phase": "Failed",
            "reason": "Evicted",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}],
        }
    elif fault == "delete-pod":
        del world.pods[pod["metadata"]["name"]]
    elif fault == "heal":
        for name in list(world.nodes):
            world.node_ready(name)  # also clears taints


def check_invariants(world: World, plan: decide.Plan, last_count: int) -> int:
    job = world.view()
    workers = [p for p in world.pods.values() if p["metadata"]["labels"][constants.LABEL_ROLE] == "worker"]
    spares = [p for p in world.pods.values() if p["metadata"]["labels"][constants.LABEL_ROLE] == "spare"]
    assert len(workers) <= job.nodes and len(spares) <= job.hot_spares
    status = world.status()
    count = status.get("restarts", {}).get("podReplacement", 0)
    # Disruptions (evictions, deleted pods) are replaced without consuming the failure budget.
    failures = status.get("budget", {}).get("failuresUsed", 0)
    assert last_count <= count and failures <= count and failures <= job.policy.max_node_replacements
    excluded = {e["nodeName"] for e in status.get("excludedNodes", [])}
    for action in plan.actions:
        if isinstance(action, decide.CreateObject) and action.kind == "Pod":
            affinity = str(action.manifest["spec"].get("affinity", {}))
            assert all(node in affinity for node in excluded), (excluded, affinity)
    return int(count)


@settings(max_examples=60, deadline=None)
# A spare's node is lost and excluded, the operator stops before deleting the spare, the node recovers.
@example(seed=180, faults=["fail-pod", "fail-pod", "taint", "not-ready", "delete-pod"], spares=2)
# A spare created before a replacement was pinned takes the pinned node; the operator stops before
# acting on it.
@example(seed=2, faults=["taint", "taint", "taint", "add-node"], spares=2)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    faults=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=6),
    spares=st.integers(min_value=0, max_value=2),
)
def test_random_fault_sequences_keep_invariants_and_end_well(
    seed: int, faults: list[str], spares: int
) -> None:
    rng = random.Random(seed)
    body = job_body(nodes=3, hotSpares=spares, failurePolicy={"backoffSeconds": 1, "maxNodeReplacements": 4})
    world = World.with_nodes(body, 6)
    world.settle()
    count = 0
    for fault in faults:
        inject(world, fault, rng)
        for _ in range(rng.randrange(1, 6)):
            plan = world.plan()
            if rng.random() < 0.3 and plan.actions:
                world.reconcile(stop_after=rng.randrange(len(plan.actions)))
            else:
                world.reconcile()
            count = check_invariants(world, plan, count)
            world.schedule()
            world.kubelets()
            world.tick(rng.choice([0.5, 2, 11]))
    for name in list(world.nodes):
        world.node_ready(name)
    for i in range(8):  # enough healthy capacity for every worker and spare
        world.nodes[f"fresh-{i}"] = node_body(f"fresh-{i}", since=world.now)
    for _ in range(60):
        plan = world.plan()
        world.reconcile()
        count = check_invariants(world, plan, count)
        world.schedule()
        world.kubelets()
        world.tick(2)
    status = world.status()
    if status["state"] == "Failed":
        assert not world.pods
        return
    assert status["state"] == "Running", (faults, status["conditions"])
    excluded = {e["nodeName"] for e in status["excludedNodes"]}
    placed = [p["spec"]["nodeName"] for p in world.pods.values()]
    assert len(placed) == len(set(placed)) == 3 + spares
    assert not excluded & set(placed)
