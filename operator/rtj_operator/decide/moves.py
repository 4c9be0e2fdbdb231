"""Moving workers off nodes that will go soon, before they go: a spot interruption notice (the
termination handler's taint `disruptions.MOVING_TAINTS`, or a notice taint or label of the operator's
settings: `decide.node_problems.node_departure`) gives two minutes, whatever the job does. With
`spec.disruption.moveOnNotice` every planned disruption of a node (a cordon, a maintenance taint:
`decide.node_problems.node_disruption`) moves its workers too, before the eviction comes.

Each running worker on such a node is deleted with its grace period (Event `WorkerMoved`): its trainer
commits the checkpoint of the step in progress at SIGTERM and its kubelet ends it; the next pass sees
a deleted pod, a `Disruption` (`decide.failures`), and the replacement is placed off the node (its
taint keeps new workers away: `PassState.excluded_names`). No fault, no failure budget.
"""

from __future__ import annotations

from rtj_operator import events
from rtj_operator.decide.node_problems import node_departure, node_disruption
from rtj_operator.decide.state import WORKER, PassState


def move_off_departing_nodes(run: PassState) -> None:
    for index in range(run.job.nodes):
        pod, entry = run.pod(WORKER, index), run.entry(WORKER, index)
        if pod is None or pod.deleting or pod.phase != "Running" or not entry.on_node:
            continue
        signal = departure_signal(run, pod.node_name)
        if signal is None:
            continue
        run.event(
            events.NORMAL,
            events.WORKER_MOVED,
            f"worker {index} moved off node {pod.node_name} ({signal}): checkpoint at SIGTERM, then a "
            "replacement elsewhere",
        )
        run.remove_pod(pod)


def departure_signal(run: PassState, node_name: str) -> str | None:
    """The signal that says the node goes (a spot interruption notice; with moveOnNotice any planned
    disruption), if it shows one."""
    node = run.observed.nodes.get(node_name)
    if node is None:
        return None
    if run.job.model.spec.disruption.move_on_notice:
        return node_disruption(node, run.observed.health)
    return node_departure(node, run.observed.health)
