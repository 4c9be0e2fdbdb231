"""Gang admission and disruption: the Kueue pod group's labels and annotations, the coscheduling
PodGroup, karpenter.sh/do-not-disrupt and the workers' PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from rtj_operator import constants, names
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.render.meta import job_uid, object_metadata, spares_in_training


def disruption_annotations(job: ResilientTrainingJob, role: str) -> dict[str, str]:
    """karpenter.sh/do-not-disrupt when spec.disruption.doNotDisrupt: on workers, on the store pod (its
    loss restarts every pod), and on the spares where they take part in the training (Supervisor's
    reserve ranks, FtLauncher's standby nodes: either may be training); spares holding nodes may go."""
    protected = role in (constants.ROLE_WORKER, constants.ROLE_STORE) or spares_in_training(job)
    if protected and job.spec.disruption.do_not_disrupt:
        return {constants.ANNOTATION_DO_NOT_DISRUPT: "true"}
    return {}


def _pod_group_size(job: ResilientTrainingJob) -> int:
    return job.spec.nodes + job.spec.hot_spares


def gang_labels(job: ResilientTrainingJob) -> dict[str, str]:
    """The labels that put a pod into the job's Kueue pod group or coscheduling PodGroup."""
    gang = job.spec.scheduling.gang
    if gang is None:
        return {}
    if gang.kueue is not None:
        return {
            constants.LABEL_KUEUE_QUEUE: gang.kueue.queue_name,
            constants.LABEL_KUEUE_POD_GROUP: names.pod_group_name(job.name),
        }
    return {constants.LABEL_COSCHEDULING_POD_GROUP: names.pod_group_name(job.name)}


def gang_annotations(job: ResilientTrainingJob) -> dict[str, str]:
    """Kueue admits a pod group once this many pods of it exist: every worker and spare."""
    gang = job.spec.scheduling.gang
    if gang is None or gang.kueue is None:
        return {}
    return {constants.ANNOTATION_KUEUE_POD_GROUP_TOTAL: str(_pod_group_size(job))}


def scheduler_name(job: ResilientTrainingJob) -> str | None:
    gang = job.spec.scheduling.gang
    return gang.coscheduling.scheduler_name if gang is not None and gang.coscheduling is not None else None


def render_pod_disruption_budget(
    job: ResilientTrainingJob, *, uid: str | None = None
) -> dict[str, Any] | None:
    """The workers' PodDisruptionBudget when spec.disruption.podDisruptionBudget is set, else None.

    ``minAvailable: nodes - maxUnavailable`` (nodes is immutable): the disruption controller counts the
    pods a ``maxUnavailable`` budget expects through their controller's scale subresource, which a
    ResilientTrainingJob has not, so such a budget fails to sync and refuses every eviction; an integer
    ``minAvailable`` needs no scale. ``unhealthyPodEvictionPolicy: AlwaysAllow``: a worker that is not
    Ready (a failed node, a pod being replaced) never holds up a node drain.
    """
    budget = job.spec.disruption.pod_disruption_budget
    if budget is None:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_metadata(job, names.disruption_budget_name(job.name), job_uid(job, uid)),
        "spec": {
            "minAvailable": max(job.spec.nodes - budget.max_unavailable, 0),
            "selector": {
                "matchLabels": {
                    **names.selector_labels(job.name),
                    constants.LABEL_ROLE: constants.ROLE_WORKER,
                }
            },
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_pod_group(job: ResilientTrainingJob, *, uid: str | None = None) -> dict[str, Any] | None:
    """The coscheduling PodGroup (minMember = nodes) when scheduling.gang.coscheduling is set, else None."""
    gang = job.spec.scheduling.gang
    if gang is None or gang.coscheduling is None:
        return None
    return {
        "apiVersion": constants.COSCHEDULING_API_VERSION,
        "kind": "PodGroup",
        "metadata": object_metadata(job, names.pod_group_name(job.name), job_uid(job, uid)),
        "spec": {
            "minMember": job.spec.nodes,
            "scheduleTimeoutSeconds": gang.coscheduling.schedule_timeout_seconds,
        },
    }
