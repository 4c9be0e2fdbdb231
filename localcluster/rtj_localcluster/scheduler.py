"""The local cluster's scheduler: the pure fit rules, and the controller that binds pods.

``node_fit_failures(pod, node, pods_on_node)`` and ``inter_pod_affinity_failures`` are the whole
placement policy as pure functions (Ready, unschedulable, taints vs tolerations, nodeSelector,
required node affinity, resource requests vs allocatable, required pod (anti-)affinity by topology
domain); ``choose_node`` ranks the nodes that fit. ``Scheduler`` watches pods and
nodes through the shared informers of ``rtj_localcluster.client`` and binds through the
``pods/binding`` subresource, like kube-scheduler; pods that fit nowhere keep
``PodScheduled=False/Unschedulable`` plus a ``FailedScheduling`` event and are retried whenever a
node or pod changes. It also applies the DefaultTolerationSeconds admission defaults (the embedded
API server has no admission plugins).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from .client import ApiError, Informer, KubeClient, now_rfc3339, path_for, run_level_triggered
from .quantity import parse_quantity

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]

DEFAULT_SCHEDULER = "default-scheduler"
# Resources the fit check compares; any other requested resource must also be allocatable.
TRACKED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa", "hugepages-2Mi")
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
DEFAULT_TOLERATION_SECONDS = 300


# ---------------------------------------------------------------------------------------------
# Pure rules
# ---------------------------------------------------------------------------------------------


def toleration_matches(toleration: Obj, taint: Obj) -> bool:
    """Whether one toleration tolerates one taint (the core/v1 Toleration semantics)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    return any(toleration_matches(t, taint) for t in tolerations)


def _label_matches(expression: Obj, labels: Mapping[str, str]) -> bool:
    key = expression.get("key", "")
    operator = expression.get("operator", "")
    values = list(expression.get("values") or [])
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def node_selector_term_matches(term: Obj, node: Obj) -> bool:
    """One NodeSelectorTerm: all its expressions and fields must match; an empty term matches nothing."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = node.get("metadata", {}).get("labels") or {}
    if not all(_label_matches(e, labels) for e in expressions):
        return False
    # Only metadata.name is a supported field for matchFields, as in Kubernetes.
    node_fields = {"metadata.name": node.get("metadata", {}).get("name", "")}
    return all(f.get("key") == "metadata.name" and _label_matches(f, node_fields) for f in fields)


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """Effective requests: max(sum of containers, largest init container), limits standing in for
    missing requests like the API server's defaulting does."""

    def container_requests(container: Obj) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = dict(resources.get("limits") or {})
        merged.update(resources.get("requests") or {})
        return {name: parse_quantity(value) for name, value in merged.items()}

    spec = pod.get("spec", {})
    result: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        for name, value in container_requests(container).items():
            result[name] = result.get(name, Fraction(0)) + value
    for init in spec.get("initContainers") or []:
        for name, value in container_requests(init).items():
            result[name] = max(result.get(name, Fraction(0)), value)
    return result


def is_terminated(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def node_is_ready(node: Obj) -> bool:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def node_fit_failures(pod: Obj, node: Obj, pods_on_node: Iterable[Obj]) -> list[str]:
    """Why ``pod`` cannot run on ``node`` (an empty list: it fits). Reasons read like kube-scheduler's."""
    spec = pod.get("spec", {})
    node_spec = node.get("spec", {})
    tolerations = spec.get("tolerations") or []
    failures: list[str] = []

    if not node_is_ready(node):
        failures.append("node(s) were not ready")
    if node_spec.get("unschedulable") and not tolerates(
        tolerations, {"key": TAINT_UNSCHEDULABLE, "effect": "NoSchedule"}
    ):
        failures.append("node(s) were unschedulable")
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            failures.append(f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}")
            break

    labels = node.get("metadata", {}).get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    affinity_ok = all(labels.get(k) == v for k, v in selector.items())
    required = (
        (spec.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is not None:
        terms = required.get("nodeSelectorTerms") or []
        affinity_ok = affinity_ok and any(node_selector_term_matches(t, node) for t in terms)
    if not affinity_ok:
        failures.append("node(s) didn't match Pod's node affinity/selector")

    allocatable = {k: parse_quantity(v) for k, v in (node.get("status", {}).get("allocatable") or {}).items()}
    used: dict[str, Fraction] = {}
    count = 0
    for other in pods_on_node:
        if is_terminated(other) or other.get("metadata", {}).get("uid") == pod.get("metadata", {}).get("uid"):
            continue
        for name, value in pod_requests(other).items():
            used[name] = used.get(name, Fraction(0)) + value
        count += 1
    if "pods" in allocatable and count + 1 > allocatable["pods"]:
        failures.append("Too many pods")
    for name, amount in sorted(pod_requests(pod).items()):
        if amount <= 0:
            continue
        if used.get(name, Fraction(0)) + amount > allocatable.get(name, Fraction(0)):
            failures.append(f"Insufficient {name}")
    return failures


def label_selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; an empty selector matches everything, a missing one nothing."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_label_matches(e, labels) for e in selector.get("matchExpressions") or [])


def _term_selects(term: Obj, owner: Obj, other: Obj) -> bool:
    """Whether ``other`` is selected by ``term`` of a pod ``owner`` (namespaces default to owner's)."""
    namespaces = set(term.get("namespaces") or [])
    other_ns = other.get("metadata", {}).get("namespace")
    if term.get("namespaceSelector") == {}:
        pass  # an empty namespaceSelector selects every namespace
    elif namespaces:
        if other_ns not in namespaces:
            return False
    elif other_ns != owner.get("metadata", {}).get("namespace"):
        return False
    return label_selector_matches(term.get("labelSelector"), other.get("metadata", {}).get("labels") or {})


def _required_terms(pod: Obj, kind: str) -> list[Obj]:
    affinity = (pod.get("spec", {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


def inter_pod_affinity_failures(
    pod: Obj, node: Obj, nodes: Mapping[str, Obj], pods: Iterable[Obj]
) -> list[str]:
    """Required pod affinity and anti-affinity of ``pod`` on ``node`` given the placed ``pods``, and
    the anti-affinity of those pods against ``pod`` (symmetry), by topology domain."""
    uid = pod.get("metadata", {}).get("uid")
    node_labels = node.get("metadata", {}).get("labels") or {}
    placed = [
        (p, nodes[p["spec"]["nodeName"]])
        for p in pods
        if p.get("spec", {}).get("nodeName") in nodes
        and not is_terminated(p)
        and p.get("metadata", {}).get("uid") != uid
    ]

    def same_domain(key: str, other_node: Obj) -> bool:
        value = node_labels.get(key)
        return value is not None and (other_node.get("metadata", {}).get("labels") or {}).get(key) == value

    failures: list[str] = []
    for term in _required_terms(pod, "podAntiAffinity"):
        key = term.get("topologyKey", "")
        if any(_term_selects(term, pod, other) and same_domain(key, where) for other, where in placed):
            failures.append("node(s) didn't satisfy pod anti-affinity rules")
            break
    for other, where in placed:
        for term in _required_terms(other, "podAntiAffinity"):
            if _term_selects(term, other, pod) and same_domain(term.get("topologyKey", ""), where):
                failures.append("node(s) didn't satisfy existing pods anti-affinity rules")
                break
        else:
            continue
        break
    for term in _required_terms(pod, "podAffinity"):
        key = term.get("topologyKey", "")
        matching = [(other, where) for other, where in placed if _term_selects(term, pod, other)]
        if any(same_domain(key, where) for _, where in matching):
            continue
        # The first pod of a group that selects itself may go anywhere the topology key exists.
        if not matching and _term_selects(term, pod, pod) and key in node_labels:
            continue
        failures.append("node(s) didn't match pod affinity rules")
        break
    return failures


def choose_node(
    pod: Obj, nodes: Sequence[Obj], pods_by_node: Mapping[str, Sequence[Obj]]
) -> tuple[str | None, str]:
    """The node to bind ``pod`` to, or None and a FailedScheduling message.

    Among fitting nodes the one with the fewest non-terminated pods wins (spreading, so a node loss
    costs as little as possible), then the name, for a deterministic choice.
    """
    fitting: list[tuple[int, str]] = []
    reasons: Counter[str] = Counter()
    by_name = {n["metadata"]["name"]: n for n in nodes}
    everywhere = [p for placed in pods_by_node.values() for p in placed]
    for node in nodes:
        name = node["metadata"]["name"]
        on_node = pods_by_node.get(name, [])
        failures = node_fit_failures(pod, node, on_node)
        failures += inter_pod_affinity_failures(pod, node, by_name, everywhere)
        if failures:
            reasons.update(set(failures))
        else:
            fitting.append((sum(1 for p in on_node if not is_terminated(p)), name))
    if fitting:
        return min(fitting)[1], ""
    detail = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
    message = f"0/{len(nodes)} nodes are available"
    return None, f"{message}: {detail}." if detail else f"{message}."


def default_tolerations(pod: Obj, seconds: int = DEFAULT_TOLERATION_SECONDS) -> list[dict[str, Any]] | None:
    """The pod's tolerations with DefaultTolerationSeconds added, or None when nothing is missing."""
    tolerations = [dict(t) for t in pod.get("spec", {}).get("tolerations") or []]
    added = False
    for key in (TAINT_NOT_READY, TAINT_UNREACHABLE):
        if not tolerates(tolerations, {"key": key, "effect": "NoExecute"}):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            )
            added = True
    return tolerations if added else None


# ---------------------------------------------------------------------------------------------
# Controller
# ---------------------------------------------------------------------------------------------


class Scheduler:
    """Binds pending pods of the default scheduler; level-triggered on every pod or node change."""

    def __init__(
        self,
        client: KubeClient,
        pods: Informer,
        nodes: Informer,
        *,
        default_toleration_seconds: int = DEFAULT_TOLERATION_SECONDS,
    ) -> None:
        self._client = client
        self._pods = pods
        self._nodes = nodes
        self._default_toleration_seconds = default_toleration_seconds
        self._wake = asyncio.Event()
        self._reported: dict[str, str] = {}  # pod uid -> the last FailedScheduling message
        # Pods bound but not yet seen bound in the informer's cache (kube-scheduler's "assumed"
        # pods): counted on their node so that a pass on a stale cache does not overbook it.
        self._assumed: dict[str, str] = {}
        pods.subscribe(self._wake.set)
        nodes.subscribe(self._wake.set)

    async def run(self) -> None:
        # Also retry on a slow timer: a bind may have raced with a change we already consumed.
        await run_level_triggered(
            "scheduling",
            (self._pods, self._nodes),
            self._wake,
            self.schedule_pending,
            period_seconds=5,
            error_delay_seconds=1,
        )

    async def schedule_pending(self) -> None:
        pods = []
        live: set[str] = set()
        for cached in self._pods.items():
            uid = cached["metadata"].get("uid", "")
            live.add(uid)
            if cached.get("spec", {}).get("nodeName"):
                self._assumed.pop(uid, None)
                pods.append(cached)
            elif uid in self._assumed:
                pods.append({**cached, "spec": {**cached.get("spec", {}), "nodeName": self._assumed[uid]}})
            else:
                pods.append(cached)
        self._assumed = {uid: node for uid, node in self._assumed.items() if uid in live}
        nodes = sorted(self._nodes.items(), key=lambda n: n["metadata"]["name"])
        pods_by_node: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            node_name = pod.get("spec", {}).get("nodeName")
            if node_name:
                pods_by_node.setdefault(node_name, []).append(pod)
        pending = [
            p
            for p in pods
            if not p.get("spec", {}).get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("spec", {}).get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
            and not is_terminated(p)
        ]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        self._reported = {uid: m for uid, m in self._reported.items() if uid in live}
        for pending_pod in pending:
            pod = pending_pod
            tolerations = default_tolerations(pod, self._default_toleration_seconds)
            if tolerations is not None:
                # Admission would have done this at create time; the pod's spec gets it before binding.
                await self._patch_pod(pod, {"spec": {"tolerations": tolerations}})
                pod = {**pod, "spec": {**pod["spec"], "tolerations": tolerations}}
            node_name, message = choose_node(pod, nodes, pods_by_node)
            if node_name is None:
                await self._unschedulable(pod, message)
                continue
            if await self._bind(pod, node_name):
                pods_by_node.setdefault(node_name, []).append(
                    {**pod, "spec": {**pod["spec"], "nodeName": node_name}}
                )

    async def _patch_pod(self, pod: Obj, body: dict[str, Any], subresource: str | None = None) -> None:
        meta = pod["metadata"]
        try:
            await self._client.patch(path_for("pods", meta["namespace"], meta["name"], subresource), body)
        except ApiError as error:
            if error.status != 404:
                raise

    async def _bind(self, pod: Obj, node_name: str) -> bool:
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
        }
        try:
            await self._client.create(path_for("pods", meta["namespace"], meta["name"], "binding"), binding)
        except ApiError as error:
            if error.status in (404, 409):
                return False  # gone, or bound by someone else meanwhile
            raise
        self._reported.pop(meta.get("uid", ""), None)
        self._assumed[meta.get("uid", "")] = node_name
        await self._event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node_name}",
        )
        return True

    async def _unschedulable(self, pod: Obj, message: str) -> None:
        meta = pod["metadata"]
        uid = meta.get("uid", "")
        if self._reported.get(uid) == message:
            return
        self._reported[uid] = message
        conditions = [
            c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"
        ]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        await self._patch_pod(pod, {"status": {"phase": "Pending", "conditions": conditions}}, "status")
        await self._event(pod, "Warning", "FailedScheduling", message)

    async def _event(self, pod: Obj, event_type: str, reason: str, message: str) -> None:
        await self._client.post_event(pod, event_type, reason, message, component=DEFAULT_SCHEDULER)
