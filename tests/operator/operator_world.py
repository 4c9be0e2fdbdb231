"""A small in-memory model of the API objects one job's reconcile touches, for the pure tests.

It stores pod, node and job bodies as the API server would return them, applies `reconcile`'s actions
to them (creates, deletes, taints), and plays the parts of the scheduler and the kubelet in single
explicit steps, so that a test can stop anywhere between two actions (a crashed operator) and check
what a fresh `reconcile` makes of the result. The objects are plain dicts shaped like the real ones;
the code under test (`observe`, `reconcile`, `render`) is the real code.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rtj_contract.times import format_rfc3339
from rtj_operator import constants, decide, observe
from rtj_operator.nodehealth import NodeHealth
from rtj_operator.progress import ProgressReport, RestartOffset

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def job_body(name: str = "train", *, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "image": "trainer:1",
            "nodes": nodes,
            "instanceType": "cpu",
            "checkpoint": {"storage": {"dynamic": {"storageClassName": "standard"}}},
        },
    }
    body["spec"].update(spec)
    return body


def node_body(name: str, *, ready: str = "True", since: datetime = T0) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, constants.LABEL_INSTANCE_TYPE: "cpu"},
        },
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": format_rfc3339(since)}],
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        },
    }


def _affinity_nodes(pod: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(nodes the pod must be on, nodes it must not be on) from its required node affinity."""
    must, must_not = set(), set()
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    for term in terms.get("nodeSelectorTerms", []):
        for expr in term.get("matchExpressions", []):
            if expr["key"] == "kubernetes.io/hostname":
                (must if expr["operator"] == "In" else must_not).update(expr["values"])
    return must, must_not


@dataclass
class World:
    job: dict[str, Any]
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    others: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    now: datetime = T0
    offsets: dict[str, RestartOffset] = field(default_factory=dict)
    events: list[decide.Event] = field(default_factory=list)
    actions_applied: list[decide.Action] = field(default_factory=list)
    job_deleted: bool = False
    uids: Any = field(default_factory=lambda: itertools.count(1))
    # A ResourceQuota on the namespace's pod count, as the API server's quota admission applies it.
    quota_pods: int | None = None
    refused_at: datetime | None = None
    # The trainers' progress reports by pod uid, as the operator last read them from the endpoints.
    reports: dict[str, ProgressReport] = field(default_factory=dict)
    # The operator's node signal settings (--node-health).
    health: NodeHealth = field(default_factory=NodeHealth)

    @classmethod
    def with_nodes(cls, job: dict[str, Any], count: int) -> World:
        world = cls(job=job)
        for i in range(count):
            world.nodes[f"node-{i}"] = node_body(f"node-{i}")
        return world

    # -- time and node faults --

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def node_not_ready(self, name: str, status: str = "Unknown") -> None:
        self.nodes[name] = node_body(name, ready=status, since=self.now)

    def node_ready(self, name: str) -> None:
        self.nodes[name] = node_body(name, since=self.now)

    def cordon(self, name: str) -> None:
        self.nodes[name]["spec"]["unschedulable"] = True

    def evict(self, role: str, index: int, reason: str = "EvictionByEvictionAPI") -> None:
        """As the Eviction API (or the taint manager, by `reason`) does: a DisruptionTarget condition
        and a graceful delete that the pod's kubelet finishes (`kubelets`)."""
        pod = self.pods[f"{self.job['metadata']['name']}-{role}-{index}"]
        pod["status"].setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": reason}
        )
        pod["metadata"]["deletionTimestamp"] = format_rfc3339(self.now)
        pod["metadata"]["deletionGracePeriodSeconds"] = 120

    def label(self, name: str, key: str, value: str) -> None:
        self.nodes[name]["metadata"]["labels"][key] = value

    def taint(self, name: str, key: str, effect: str = "NoExecute") -> None:
        self.nodes[name]["spec"].setdefault("taints", []).append(
            {"key": key, "effect": effect, "timeAdded": format_rfc3339(self.now)}
        )

    # -- reconcile --

    def view(self) -> observe.JobView:
        return observe.observe_job(self.job)

    def observed(self, *, ensure_base: bool = False) -> observe.Observed:
        return observe.observe(
            self.pods.values(),
            self.nodes.values(),
            ensure_base=ensure_base,
            offsets=self.offsets,
            refused_at=self.refused_at,
            reports=self.reports,
            health=self.health,
        )

    def plan(self, *, ensure_base: bool = False) -> decide.Plan:
        return decide.reconcile(self.view(), self.observed(ensure_base=ensure_base), self.now)

    def reconcile(
        self, *, ensure_base: bool = False, stop_after: int | None = None, write_status: bool = True
    ) -> decide.Plan:
        """One operator pass: status first, then the actions (all of them, or the first `stop_after`)."""
        plan = self.plan(ensure_base=ensure_base)
        if not write_status:
            return plan
        if plan.status_changed:
            self.job["status"] = plan.status.to_status()
        self.offsets = dict(plan.offsets)
        self.events.extend(plan.events)
        for n, action in enumerate(plan.actions):
            if stop_after is not None and n >= stop_after:
                break
            refusal = self.refusal(action)
            if refusal is not None and isinstance(action, decide.CreateObject) and action.optional:
                # As runtime.job_pass does: a refused surge pod's entry leaves status, nothing is held.
                self.actions_applied.append(action)
                status, _, emitted = decide.surge_refused(
                    self.job.get("status", {}), refusal.name, refusal.describe()
                )
                self.job["status"] = status
                self.events.extend(emitted)
                continue
            if refusal is not None:
                # As runtime.job_pass does: the refusal becomes a condition in the same pass.
                self.actions_applied.append(action)
                self.refused_at = self.now
                status, _, emitted = decide.record_refusal(
                    self.job.get("status", {}), self.job["metadata"]["generation"], refusal, self.now
                )
                self.job["status"] = status
                self.events.extend(emitted)
                break
            self.apply(action)
        return plan

    def refusal(self, action: decide.Action) -> decide.Refusal | None:
        """What the API server's quota admission says of a create, as runtime.kube reports it."""
        if not isinstance(action, decide.CreateObject) or action.kind != "Pod" or self.quota_pods is None:
            return None
        if action.name in self.pods or len(self.pods) < self.quota_pods:
            return None
        used = len(self.pods)
        return decide.Refusal(
            "Pod",
            action.name,
            403,
            "Forbidden",
            f'pods "{action.name}" is forbidden: exceeded quota: q, requested: pods=1, '
            f"used: pods={used}, limited: pods={self.quota_pods}",
        )

    def creates(self, kind: str = "Pod") -> int:
        """Create calls made so far for objects of `kind` (refused ones included)."""
        return sum(1 for a in self.actions_applied if isinstance(a, decide.CreateObject) and a.kind == kind)

    def apply(self, action: decide.Action) -> None:
        self.actions_applied.append(action)
        if isinstance(action, decide.CreateObject):
            manifest = copy.deepcopy(action.manifest)
            meta = manifest["metadata"]
            if manifest["kind"] == "Pod":
                if meta["name"] in self.pods:
                    return  # AlreadyExists: success
                meta["uid"] = f"pod-uid-{next(self.uids)}"
                meta["creationTimestamp"] = format_rfc3339(self.now)
                manifest["status"] = {"phase": "Pending"}
                self.pods[meta["name"]] = manifest
            else:
                self.others.setdefault((manifest["kind"], meta["name"]), manifest)
        elif isinstance(action, decide.DeletePod):
            pod = self.pods.get(action.name)
            if pod is None or pod["metadata"]["uid"] != action.uid:
                return
            # As the API server does: a force delete, or the delete of a pod not bound to a node yet,
            # removes the pod at once; otherwise its kubelet finishes the deletion.
            if action.grace_seconds == 0 or not pod["spec"].get("nodeName"):
                del self.pods[action.name]
            else:
                pod["metadata"]["deletionTimestamp"] = format_rfc3339(self.now)
                pod["metadata"]["deletionGracePeriodSeconds"] = 30
        elif isinstance(action, decide.DeleteObject):
            self.others.pop((action.kind, action.name), None)
        elif isinstance(action, decide.TaintNode):
            taints = self.nodes[action.node]["spec"].setdefault("taints", [])
            entry = {"key": action.key, "value": action.value, "effect": action.effect}
            if action.remove:
                taints[:] = [t for t in taints if t != entry]
            elif entry not in taints:
                taints.append(entry)
        elif isinstance(action, decide.DeleteJob):
            self.job_deleted = True

    # -- the scheduler and the kubelets --

    def healthy(self, node: str) -> bool:
        body = self.nodes.get(node)
        return body is not None and body["status"]["conditions"][0]["status"] == "True"

    def schedule(self) -> None:
        for pod in sorted(self.pods.values(), key=lambda p: p["metadata"]["name"]):
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            must, must_not = _affinity_nodes(pod)
            busy = {p["spec"].get("nodeName") for p in self.pods.values()}
            for name in sorted(self.nodes):
                if not self.healthy(name) or name in must_not or (must and name not in must) or name in busy:
                    continue
                if self.nodes[name]["spec"].get("unschedulable"):
                    continue  # cordoned
                tolerated = {t.get("key") for t in pod["spec"].get("tolerations", [])}
                if any(t["key"] not in tolerated for t in self.nodes[name]["spec"].get("taints", [])):
                    continue
                pod["spec"]["nodeName"] = name
                break

    def kubelets(self) -> None:
        """Healthy nodes start their pods and finish deleting theirs; dead nodes do nothing."""
        for name, pod in list(self.pods.items()):
            node = pod["spec"].get("nodeName")
            if not node or not self.healthy(node):
                continue
            if pod["metadata"].get("deletionTimestamp"):
                del self.pods[name]
            elif pod["status"]["phase"] == "Pending":
                pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}

    def settle(self, rounds: int = 10, *, step: float = 1.0) -> None:
        """Run operator, scheduler and kubelets until nothing changes (or `rounds` passes)."""
        for _ in range(rounds):
            plan = self.reconcile()
            before = copy.deepcopy(self.pods)
            self.schedule()
            self.kubelets()
            self.tick(step)
            if not plan.actions and not plan.status_changed and before == self.pods:
                break

    # -- queries --

    def pod(self, role: str, index: int) -> dict[str, Any] | None:
        name = f"{self.job['metadata']['name']}-{role}-{index}"
        return self.pods.get(name)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.job.get("status", {})
        return result

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == type_)

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]

    def set_pod(self, role: str, index: int, change: Callable[[dict[str, Any]], None]) -> None:
        pod = self.pod(role, index)
        assert pod is not None
        change(pod)


# -- helpers of the decision tests --

WORKER, SPARE = constants.ROLE_WORKER, constants.ROLE_SPARE


def running_world(nodes: int = 2, node_count: int = 4, **spec: object) -> World:
    world = World.with_nodes(job_body(nodes=nodes, **spec), node_count)
    world.settle()
    assert world.status()["state"] == "Running"
    world.events.clear()
    return world


def uids(world: World) -> dict[str, str]:
    """Each pod's uid, by name: a pod that was recreated has a new one."""
    return {name: pod["metadata"]["uid"] for name, pod in world.pods.items()}


def lose_store_node(world: World, store_pod: str) -> str:
    """The store pod's node goes NotReady past the grace, and the world settles; the node's name."""
    lost = str(world.pods[store_pod]["spec"]["nodeName"])
    world.node_not_ready(lost)
    world.tick(11)
    world.settle()
    return lost


def node_of(world: World, role: str, index: int) -> str:
    pod = world.pod(role, index)
    assert pod is not None
    return str(pod["spec"]["nodeName"])
