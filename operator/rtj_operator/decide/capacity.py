"""Capacity: can the job's workers ever fit the cluster's nodes? Checked before pods are created.

A job that needs more nodes than can ever hold one of its workers would leave most of its pods
Pending and flood the scheduler (a 1,000-node job on 4 nodes: 1,000 pods, hundreds of
FailedScheduling events). `fit` judges each node against a rendered worker pod by what does not
change while the job waits: schedulable, nodeSelector, required node affinity (instance type,
user terms, the job's excluded nodes), NoSchedule/NoExecute taints tolerated, and allocatable that
covers the pod's requests (cpu, memory, nvidia.com/gpu, vpc.amazonaws.com/efa, hugepages-2Mi, ...).
What other pods use is the scheduler's business: allocatable is what a node could give.

`hold_pods` drops the pass's pod creates and sets `Blocked=True` with reason `InsufficientNodes`
and the count of nodes per cause, while fewer nodes fit than `spec.nodes`; node events bring the
job back (runtime.handlers). Pure.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rtj_contract.quantity import parse_quantity

from rtj_operator import constants, events, render
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.actions import CreateObject
from rtj_operator.decide.state import PassState
from rtj_operator.observe import NodeState, Toleration

HOSTNAME_LABEL = "kubernetes.io/hostname"


def quantity(value: object) -> Fraction | None:
    """A Kubernetes quantity string (or number) as an exact number; None when it is not one."""
    if isinstance(value, bool):
        return None
    return _parsed(value if isinstance(value, int | float) else str(value))


@functools.lru_cache(maxsize=4096)
def _parsed(value: str | int | float) -> Fraction | None:
    """Parsed once per distinct value: a pass checks every node's allocatable (the same few
    strings across 1,000 nodes)."""
    try:
        return parse_quantity(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class Fit:
    """How many nodes could hold one worker, and why each other node cannot (cause -> node count)."""

    fitting: int
    causes: Mapping[str, int]

    def message(self, needed: int) -> str:
        why = ", ".join(f"{count} {cause}" for cause, count in sorted(self.causes.items()))
        text = f"{needed} nodes needed for the workers, {self.fitting} can hold one"
        return f"{text}; the others: {why}" if why else text


def fit(pod: Mapping[str, Any], nodes: Iterable[NodeState]) -> Fit:
    """Judge every node against `pod` (a rendered worker); see the module's docstring."""
    causes: Counter[str] = Counter()
    fitting = 0
    requests = _requests(pod)
    spec = pod.get("spec") or {}
    tolerations = [_toleration(t) for t in spec.get("tolerations") or []]
    for node in nodes:
        cause = _unfit(node, spec, tolerations, requests)
        if cause is None:
            fitting += 1
        else:
            causes[cause] += 1
    return Fit(fitting, dict(causes))


def _unfit(
    node: NodeState,
    spec: Mapping[str, Any],
    tolerations: Sequence[Toleration],
    requests: Mapping[str, Fraction],
) -> str | None:
    """The first reason `node` can never hold the pod, or None."""
    if node.unschedulable:
        return "unschedulable"
    if any(node.labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return "not matching nodeSelector"
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    if terms and not any(_term_matches(node, term) for term in terms):
        return _affinity_cause(node, terms)
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(t.matches(taint) for t in tolerations):
            return f"with untolerated taint {taint.key}"
    for resource, wanted in sorted(requests.items()):
        have = quantity(node.allocatable.get(resource, "0"))
        if have is None or have < wanted:
            return f"with too little allocatable {resource}"
    return None


def _affinity_cause(node: NodeState, terms: Sequence[Mapping[str, Any]]) -> str:
    """Name the affinity requirement a node misses: its instance type, an exclusion, or a user term."""
    expressions = [e for term in terms for e in term.get("matchExpressions") or []]
    for expr in expressions:
        if expr.get("key") == constants.LABEL_INSTANCE_TYPE and not _expression_matches(node, expr):
            return "of another instance type"
    for expr in expressions:
        if expr.get("key") == HOSTNAME_LABEL and not _expression_matches(node, expr):
            return "excluded (faults, NotReady)"
    return "not matching the node affinity terms"


def _term_matches(node: NodeState, term: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    return all(_expression_matches(node, e) for e in expressions) and all(
        _expression_matches(node, f, {"metadata.name": node.name}) for f in fields
    )


def _expression_matches(
    node: NodeState, expr: Mapping[str, Any], values: Mapping[str, str] | None = None
) -> bool:
    labels = node.labels if values is None else values
    key, operator = str(expr.get("key")), str(expr.get("operator"))
    wanted = [str(v) for v in expr.get("values") or []]
    present = key in labels
    value = labels.get(key, "")
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and wanted and value.isdigit() and wanted[0].isdigit():
        return int(value) > int(wanted[0]) if operator == "Gt" else int(value) < int(wanted[0])
    return False


def _toleration(raw: Mapping[str, Any]) -> Toleration:
    return Toleration(
        key=str(raw.get("key") or ""),
        operator=str(raw.get("operator") or "Equal"),
        value=str(raw.get("value") or ""),
        effect=str(raw.get("effect") or ""),
        seconds=None,
    )


def _requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """The pod's requests summed over its containers (a limit without a request requests the limit)."""
    total: dict[str, Fraction] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, raw in asked.items():
            amount = quantity(raw)
            if amount is not None and amount > 0:
                total[name] = total.get(name, Fraction(0)) + amount
    return total


def hold_pods(run: PassState) -> None:
    """No pod is created while fewer nodes can ever hold a worker than the job needs."""
    blocked = _capacity_blocked(run)
    wants_pods = any(isinstance(a, CreateObject) and a.kind == "Pod" for a in run.actions)
    if not wants_pods and not blocked:
        return
    pod = render.render_worker_pod(run.job.model, 0, uid=run.job.uid, excluded_nodes=run.excluded_names())
    found = fit(pod, run.observed.nodes.values())
    if found.fitting >= run.job.nodes:
        if blocked:
            run.condition(cond.COND_BLOCKED, False, cond.REASON_NOT_BLOCKED, found.message(run.job.nodes))
        return
    run.actions = [a for a in run.actions if not (isinstance(a, CreateObject) and a.kind == "Pod")]
    run.created_pods = False
    message = found.message(run.job.nodes)
    said = blocked_now.message if (blocked_now := cond.find(run.conditions, cond.COND_BLOCKED)) else None
    flipped = run.condition(cond.COND_BLOCKED, True, events.INSUFFICIENT_NODES, message)
    if flipped or said != message:
        run.event(events.WARNING, events.INSUFFICIENT_NODES, message)


def _capacity_blocked(run: PassState) -> bool:
    return cond.true_with_reason(run.conditions, cond.COND_BLOCKED, {events.INSUFFICIENT_NODES}) is not None
