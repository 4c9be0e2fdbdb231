"""Whether a drain waits for the job: the DrainWaiting condition of a job with a PodDisruptionBudget.

With `spec.disruption.podDisruptionBudget` the API server refuses the eviction of a worker beyond
`maxUnavailable` (less the workers already unavailable: the budget's `unhealthyPodEvictionPolicy:
AlwaysAllow` lets those go), and `kubectl drain`, Karpenter or the termination handler retry until
the budget allows it. A refused eviction leaves no trace on the pod, so the job says it instead:
`DrainWaiting=True` (`PodDisruptionBudget`) while more ready workers sit on nodes being taken out (a
cordon, a maintenance taint: `decide.node_problems.node_disruption`) than the budget lets go, naming them; one
Warning Event when it turns True. False (`NoDrainWaiting`) otherwise; absent for a job without a
budget. It never blocks silently: the message says how to let the drain go.

Pure: the pass state in, a condition and an Event out.
"""

from __future__ import annotations

from rtj_operator import events, names
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.node_problems import node_disruption
from rtj_operator.decide.state import WORKER, PassState


def watch_drains(run: PassState) -> None:
    budget = run.job.model.spec.disruption.pod_disruption_budget
    if budget is None:
        return
    held = held_workers(run)
    unavailable = sum(1 for i in range(run.job.nodes) if not _ready(run, i))
    allowed = max(budget.max_unavailable - unavailable, 0)
    if len(held) <= allowed:
        run.condition(
            cond.COND_DRAIN_WAITING, False, cond.REASON_NO_DRAIN_WAITING, "no drain waits for the job"
        )
        return
    which = ", ".join(f"worker {index} on {node} ({signal})" for index, node, signal in held)
    message = (
        f"{which}: the PodDisruptionBudget {names.disruption_budget_name(run.job.name)} "
        f"(maxUnavailable {budget.max_unavailable}) lets {allowed} more go, so a drain of these nodes "
        "waits until the job ends, the budget is raised or removed, or the node is uncordoned"
    )
    if run.condition(cond.COND_DRAIN_WAITING, True, cond.REASON_POD_DISRUPTION_BUDGET, message):
        run.event(events.WARNING, cond.COND_DRAIN_WAITING, message)


def held_workers(run: PassState) -> list[tuple[int, str, str]]:
    """(index, node, signal) of each ready worker whose node is being taken out."""
    held = []
    for index in range(run.job.nodes):
        pod = run.pod(WORKER, index)
        node = run.observed.nodes.get(pod.node_name) if pod is not None else None
        if pod is None or node is None or pod.deleting or not _ready(run, index):
            continue
        signal = node_disruption(node, run.observed.health)
        if signal is not None:
            held.append((index, node.name, signal))
    return held


def _ready(run: PassState, index: int) -> bool:
    pod = run.pod(WORKER, index)
    return pod is not None and pod.ready and pod.phase == "Running" and not pod.deleting
