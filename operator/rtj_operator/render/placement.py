"""Where the job's pods may run: node affinity (instance type, excluded nodes, the file system's
zone, the user's terms), one pod per node, the same topology, and the node-loss tolerations."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rtj_operator import constants, names
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.profiles import GPU_RESOURCE, resolve_sizing
from rtj_operator.render.meta import has_store_pod

HOSTNAME_LABEL = "kubernetes.io/hostname"


# Taints the node lifecycle controller puts on a lost node; DefaultTolerationSeconds would otherwise
# give every pod 300 s on them (FIELD_NOTES: ~5 min 50 s before eviction).
NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def trainer_affinity(
    job: ResilientTrainingJob, excluded_nodes: Iterable[str], node_name: str | None
) -> dict[str, Any]:
    required: list[dict[str, Any]] = [
        {"key": constants.LABEL_INSTANCE_TYPE, "operator": "In", "values": [job.spec.instance_type]}
    ]
    excluded = sorted(set(excluded_nodes) - ({node_name} if node_name else set()))
    if excluded:
        required.append({"key": HOSTNAME_LABEL, "operator": "NotIn", "values": excluded})
    if node_name is not None:
        required.append({"key": HOSTNAME_LABEL, "operator": "In", "values": [node_name]})
    required += _zone_requirements(job)
    user_terms = [
        [expr.model_dump(by_alias=True, exclude_none=True) for expr in term.match_expressions]
        for term in job.spec.scheduling.required_node_affinity_terms
    ]
    # Terms are ORed and a term's expressions ANDed: ours go into every term.
    terms = [{"matchExpressions": [*user, *required]} for user in user_terms] or [
        {"matchExpressions": required}
    ]
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    same_topology = _same_topology_affinity(job)
    if same_topology is not None:
        affinity["podAffinity"] = same_topology
    return {
        **affinity,
        # One pod of the job per node: a spare holds a whole node, a worker owns its node's devices.
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": trainer_pods_selector(job), "topologyKey": HOSTNAME_LABEL}
            ]
        },
    }


def trainer_pods_selector(job: ResilientTrainingJob) -> dict[str, Any]:
    """The job's worker, spare and surge pods. A store pod carries the job's label too, and must neither steer
    the workers' zone (pod affinity) nor count as their peer: it is kept out."""
    selector: dict[str, Any] = {"matchLabels": names.selector_labels(job.name)}
    if has_store_pod(job):
        selector["matchExpressions"] = [
            {
                "key": constants.LABEL_ROLE,
                "operator": "In",
                "values": [constants.ROLE_WORKER, constants.ROLE_SPARE, constants.ROLE_SURGE],
            }
        ]
    return selector


def trainer_tolerations(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    tolerations: list[dict[str, Any]] = []
    if resolve_sizing(job.spec.instance_type, job.spec.resources).gpus > 0:
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    grace = job.spec.failure_policy.node_loss_grace_seconds
    tolerations += [
        {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": grace}
        for taint in NODE_LOSS_TAINTS
    ]
    tolerations += [
        t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in job.spec.scheduling.tolerations
    ]
    return tolerations


def _zone_requirements(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """The FSx file system's zone, when the spec gives it: pods must run there (node affinity)."""
    fsx = job.spec.checkpoint.storage.fsx_static
    if fsx is None or fsx.availability_zone is None:
        return []
    return [{"key": constants.LABEL_ZONE, "operator": "In", "values": [fsx.availability_zone]}]


def _same_topology_affinity(job: ResilientTrainingJob) -> dict[str, Any] | None:
    """Required pod affinity among the job's pods, one term per key of scheduling.sameTopology.

    The first pod matches its own selector, and the scheduler lets it go to any domain (the
    inter-pod affinity's exception for the first of a group); the others follow it, replacements
    included, so a job stays in the zone (or node group) its pods already run in.
    """
    keys = job.spec.scheduling.same_topology
    if not keys:
        return None
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": trainer_pods_selector(job), "topologyKey": key} for key in keys
        ]
    }


def volume_zone_affinity(job: ResilientTrainingJob) -> dict[str, Any]:
    """A zonal PersistentVolume's nodeAffinity (the scheduler's volume binding checks it too)."""
    zone = _zone_requirements(job)
    if not zone:
        return {}
    return {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": zone}]}}}


@dataclass(frozen=True)
class Placement:
    """Where a pod may go: kept off `excluded_nodes`, pinned to `node_name` if set."""

    excluded_nodes: tuple[str, ...] = ()
    node_name: str | None = None
