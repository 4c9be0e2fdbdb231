"""The pure renderer: a parsed ResilientTrainingJob in, the Kubernetes objects it needs out.

No I/O and no clock: the same job, uid and excluded nodes always give the same objects (and the same
YAML bytes), so the operator can re-render at any time and compare. :func:`render` returns every child
(docs/architecture.md, "What the renderer produces"); the operator's decisions
(:mod:`rtj_operator.decide`) call :func:`render_base`, :func:`render_worker_pod` (a replacement
included, with its annotations), :func:`render_spare_pod` and :func:`render_surge_pod` and send what
they return as it is.
Names come from :mod:`rtj_operator.names`, sizing from :mod:`rtj_operator.profiles`, label and
annotation names from :mod:`rtj_operator.constants`, the environment's from :mod:`rtj_contract.env`
(the trainer reads the same names).

One module per concern, assembled here: ``meta`` (what every child shares), ``env`` (the trainer's
environment), ``placement`` (affinity and tolerations), ``storage`` (the checkpoint's claim and the
volumes), ``pod_runtime`` (the runtime from spec.runtimeImage), ``security`` (security contexts, the
ServiceAccount), ``gang`` (gang admission and disruption), ``pods`` (workers, spares and surge pods),
``store_pod`` and ``service``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rtj_operator.api import ResilientTrainingJob
from rtj_operator.render.env import ft_launcher_config_yaml
from rtj_operator.render.gang import render_pod_disruption_budget, render_pod_group
from rtj_operator.render.meta import (
    checkpoint_claim_name,
    has_store_pod,
    is_supervisor,
    job_uid,
    nnodes_max,
    slot,
    spares_in_training,
)
from rtj_operator.render.placement import NODE_LOSS_TAINTS
from rtj_operator.render.pod_runtime import INSTALL_RUNTIME_ARG, LAUNCH_COMMAND
from rtj_operator.render.pods import Replacement, render_spare_pod, render_surge_pod, render_worker_pod
from rtj_operator.render.security import render_service_account
from rtj_operator.render.service import render_service
from rtj_operator.render.storage import render_storage
from rtj_operator.render.store_pod import STORE_COMMAND, render_store_pod

__all__ = [
    "INSTALL_RUNTIME_ARG",
    "LAUNCH_COMMAND",
    "NODE_LOSS_TAINTS",
    "STORE_COMMAND",
    "Replacement",
    "checkpoint_claim_name",
    "ft_launcher_config_yaml",
    "has_store_pod",
    "is_supervisor",
    "nnodes_max",
    "render",
    "render_base",
    "render_pod_disruption_budget",
    "render_pod_group",
    "render_service",
    "render_service_account",
    "render_spare_pod",
    "render_storage",
    "render_store_pod",
    "render_surge_pod",
    "render_worker_pod",
    "slot",
    "spares_in_training",
]


def render_base(job: ResilientTrainingJob, *, uid: str | None = None) -> list[dict[str, Any]]:
    """The children other than pods, in creation order: ServiceAccount, storage, Service, then the
    opt-in PodDisruptionBudget and coscheduling PodGroup."""
    owner = job_uid(job, uid)
    optional = [render_pod_disruption_budget(job, uid=owner), render_pod_group(job, uid=owner)]
    return [
        *render_service_account(job, uid=owner),
        *render_storage(job, uid=owner),
        render_service(job, uid=owner),
        *(child for child in optional if child is not None),
    ]


def render(
    job: ResilientTrainingJob, *, uid: str | None = None, excluded_nodes: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Every child of the job, in creation order: ServiceAccount, storage, Service,
    (PodDisruptionBudget, PodGroup), (the store pod, when the job has one), workers, spares.

    ``uid`` defaults to ``job.metadata.uid`` (owner references and the rendezvous id need one);
    ``excluded_nodes`` are kept out of every pod's node affinity. Suspended jobs still render their
    pods: whether to create them is the operator's decision.
    """
    owner = job_uid(job, uid)
    excluded = tuple(excluded_nodes)
    return [
        *render_base(job, uid=owner),
        *([render_store_pod(job, uid=owner, excluded_nodes=excluded)] if has_store_pod(job) else []),
        *(render_worker_pod(job, i, uid=owner, excluded_nodes=excluded) for i in range(job.spec.nodes)),
        *(render_spare_pod(job, k, uid=owner, excluded_nodes=excluded) for k in range(job.spec.hot_spares)),
    ]
