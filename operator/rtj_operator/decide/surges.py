"""Surge pods: a drained worker's replacement asks for its node while the old pod still checkpoints.

A worker pod deleted with a grace period on a node that is not lost (a `kubectl drain`, a Karpenter
consolidation, an eviction, a move on a spot notice: `decide.moves`) commits a checkpoint at SIGTERM
and is ended by its own kubelet. Its replacement has the same name (names are fixed per index: the
name is the pod's DNS hostname under the job's Service, and worker 0's is the rendezvous host), so
`placement` creates it only once the old pod object is gone, and two incarnations of a worker never
run at once. Without a hot spare to take, the replacement's scheduling, node provisioning and image
pull would all begin only then.

So, in the pass that decides to replace such a worker alone (not a gang restart: `failures` fills
`PassState.replaced_alone`), when no ready hot spare outside the training can take its place, the
operator creates a surge pod `J-surge-<i>` (`render.render_surge_pod`: rendered as a spare outside the
training, sized like a worker, running no rank), kept off the excluded nodes, the nodes not Ready or
showing a health signal or a planned disruption, the nodes replacements are pinned to and the
worker's own node. Its entry in `status.workers.pods` (role `surge`) records that decision before the
create: a later pass creates the pod again if it went or failed while the old pod still terminates.

When the old pod is gone, `placement` creates the replacement and calls `take_surge`: pinned to the
surge pod's node if the surge pod runs there, ready, on a node still fit (Event `SurgeUsed`), else
placed by the scheduler; the surge pod is deleted either way, gracefully, as a given-up spare is (the
pinned replacement's affinity waits until it has left the node). A surge pod without an entry, or
whose worker is no longer being replaced, is deleted. Surge pods count as no worker, no fault and no
budget, and run no rank. A surge pod the API server refuses (a quota) blocks nothing: the runtime
drops its entry (`surge_refused`, Event `SurgeRefused`) and the replacement comes as it would without.

None where the spares take part in the training (a spare takes over at once there), with gang
scheduling (Kueue admits a pod group of a fixed count; the coscheduling PodGroup counts its members:
a surge pod is neither), or with `spec.disruption.surge` false. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rtj_operator import events, render
from rtj_operator.api import EntryState
from rtj_operator.decide.actions import CreateObject, Event
from rtj_operator.decide.state import (
    SURGE,
    WORKER,
    PassState,
    discard_pod,
    holds_fit_node,
    pinned_nodes,
    spares_to_take,
)
from rtj_operator.observe import PodState


def surges_allowed(run: PassState) -> bool:
    """Whether the job makes surge pods at all."""
    spec = run.job.model.spec
    return spec.disruption.surge and not run.job.spares_in_training and spec.scheduling.gang is None


def run_surges(run: PassState) -> None:
    """Create the surge pods this pass wants, keep the wanted ones toward a running pod on a fit node,
    and delete the others. After `placement.run_workers`, which takes the surges it uses."""
    for index in range(run.job.nodes):
        _run_surge(run, index)


def _run_surge(run: PassState, index: int) -> None:
    entry, pod = run.entries.get((SURGE, index)), run.pod(SURGE, index)
    if entry is None:
        if index in run.replaced_alone and may_surge(run, index):
            _create(run, index)
            _announce(run, index)
        elif pod is not None:
            run.remove_pod(pod)  # no surge is wanted for this worker
        return
    worker = run.entries.get((WORKER, index))
    if worker is None or worker.state != EntryState.REPLACING:
        _drop(run, index)  # the worker is no longer being replaced: the surge has no purpose left
        return
    if pod is None:
        if may_surge(run, index):
            _create(run, index)  # the create never happened (a crash, a held create) or the pod went
        else:
            del run.entries[(SURGE, index)]
        return
    if pod.deleting:
        return  # its kubelet ends it; created again once it is gone, if still wanted
    if _unfit(run, pod):
        entry.reset()
        run.remove_pod(pod)
        return
    if pod.node_name:
        entry.state = EntryState.RUNNING if pod.phase == "Running" else EntryState.PENDING
        entry.node_name = pod.node_name


def may_surge(run: PassState, index: int) -> bool:
    """Whether worker `index` may have a surge pod now: it is being replaced, its old pod is being
    deleted with a grace period on a node that is not lost (its kubelet will end it after the
    checkpoint at SIGTERM), and no ready hot spare outside the training is left to take its place."""
    if not surges_allowed(run):
        return False
    worker, old = run.entries.get((WORKER, index)), run.pod(WORKER, index)
    if worker is None or worker.state != EntryState.REPLACING or old is None:
        return False
    if not old.deleting or old.deletion_grace_seconds == 0:
        return False
    if run.problem(old) is not None:
        return False  # a node loss: the pod is force-deleted, the replacement comes at once
    return not _spare_left_for(run, index)


def _spare_left_for(run: PassState, index: int) -> bool:
    """Whether a ready spare outside the training is left for worker `index`'s replacement: the spares
    go, by index, to the workers being replaced that have no surge pod wanted."""
    spares = len(spares_to_take(run, run.excluded_names()))
    waiting = [
        i
        for i in range(run.job.nodes)
        if (entry := run.entries.get((WORKER, i))) is not None
        and entry.state == EntryState.REPLACING
        and (SURGE, i) not in run.entries
    ]
    return index in waiting[:spares]


def _create(run: PassState, index: int) -> None:
    run.entry(SURGE, index).reset()
    excluded = set(run.excluded_names()) | pinned_nodes(run)
    old = run.pod(WORKER, index)
    if old is not None and old.node_name:
        excluded.add(old.node_name)
    manifest = render.render_surge_pod(run.job.model, index, uid=run.job.uid, excluded_nodes=sorted(excluded))
    run.actions.append(CreateObject(manifest, optional=True))
    run.created_pods = True


def _announce(run: PassState, index: int) -> None:
    old = run.pod(WORKER, index)
    where = f" on node {old.node_name}" if old is not None and old.node_name else ""
    run.event(
        events.NORMAL,
        events.SURGE_CREATED,
        f"worker {index}'s pod is terminating{where} (its checkpoint at SIGTERM): surge pod "
        f"{run.job.pod_name(SURGE, index)} asks for its replacement's node meanwhile",
    )
    run.counters["surges_created"] += 1


def _unfit(run: PassState, pod: PodState) -> bool:
    """A surge pod that cannot give its node to the replacement: ended, disrupted, its node lost,
    excluded, or showing a health signal or a planned disruption."""
    if pod.phase in {"Failed", "Succeeded"} or pod.disruption:
        return True
    return bool(pod.node_name) and (run.problem(pod) is not None or pod.node_name in run.excluded_names())


def _drop(run: PassState, index: int) -> None:
    discard_pod(run, (SURGE, index))
    run.entries.pop((SURGE, index), None)


def take_surge(run: PassState, index: int, excluded: Sequence[str]) -> str | None:
    """The node of worker `index`'s surge pod, for its replacement being created now, if the surge pod
    runs there, ready, on a node still fit (not in `excluded`); the surge pod is deleted either way."""
    entry = run.entries.pop((SURGE, index), None)
    # Graceful: the replacement is pinned to the node by required affinity, so the scheduler waits
    # until the surge pod has left it (a surge pod on a dead node is force-deleted).
    pod = discard_pod(run, (SURGE, index))
    if pod is None or entry is None or not holds_fit_node(run, pod, excluded) or _unfit(run, pod):
        return None
    run.event(
        events.NORMAL,
        events.SURGE_USED,
        f"worker {index} replaced on node {pod.node_name}, which surge pod {pod.name} held",
    )
    run.counters["surges_used"] += 1
    return pod.node_name


def surge_refused(
    status: Mapping[str, Any], pod_name: str, message: str
) -> tuple[dict[str, Any], bool, tuple[Event, ...]]:
    """The job's status without the entry of the surge pod `pod_name` that the API server refused
    (`message`: why), and a Warning saying so; returns (status, changed, events). The replacement then
    comes as it would without a surge: a quota that leaves no room for one more pod blocks nothing."""
    workers = status.get("workers")
    entries = workers.get("pods") if isinstance(workers, Mapping) else None
    if not isinstance(workers, Mapping) or not isinstance(entries, list):
        return dict(status), False, ()
    kept = [e for e in entries if not (isinstance(e, Mapping) and _names_surge(e, pod_name))]
    if len(kept) == len(entries):
        return dict(status), False, ()
    index = pod_name.rpartition("-")[2]
    refused = Event(
        events.WARNING,
        events.SURGE_REFUSED,
        f"surge pod {pod_name} refused; worker {index}'s replacement asks for its node once the old pod "
        f"is gone: {message}",
    )
    return {**status, "workers": {**workers, "pods": kept}}, True, (refused,)


def _names_surge(entry: Mapping[str, Any], pod_name: str) -> bool:
    return entry.get("role") == SURGE and entry.get("podName") == pod_name
