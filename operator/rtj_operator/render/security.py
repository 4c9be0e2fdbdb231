"""Least privilege: the Pod Security `restricted` settings for every container (IPC_LOCK added for
EFA), the pod's user and group, and the trainer's own ServiceAccount without a token."""

from __future__ import annotations

from typing import Any

from rtj_operator import constants, names
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.profiles import resolve_sizing
from rtj_operator.render.meta import job_uid, object_metadata

# EFA registers (pins) memory for RDMA; the only capability a trainer container ever adds.
EFA_CAPABILITIES = ("IPC_LOCK",)


def trainer_security_context(job: ResilientTrainingJob) -> dict[str, Any]:
    """Least privilege for the trainer: the Pod Security `restricted` settings, but for IPC_LOCK on EFA.

    Non-root (the image must name a numeric non-root user, or the pod set runAsUser), no privilege
    escalation, the runtime's default seccomp profile, a read-only root filesystem (writes go to the
    volumes above) and every capability dropped; nodes with EFA adapters add back IPC_LOCK for RDMA
    memory registration (docs/security.md says when it takes effect).
    """
    context = restricted_security_context()
    if resolve_sizing(job.spec.instance_type, job.spec.resources).efa_adapters > 0:
        context["capabilities"]["add"] = list(EFA_CAPABILITIES)
    return context


def restricted_security_context() -> dict[str, Any]:
    """The Pod Security `restricted` settings with a read-only root filesystem: the store's, the
    runtime's init container's, and the trainer's but for EFA."""
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security_context() -> dict[str, Any]:
    """The trainer image's user, and fsGroup for volumes whose driver applies it (emptyDir, block
    volumes); OnRootMismatch skips the recursive change when the root already has the group. The
    runtime's default seccomp profile for every container, the init container included."""
    return {
        "runAsUser": constants.TRAINER_UID,
        "runAsGroup": constants.TRAINER_GID,
        "fsGroup": constants.TRAINER_GID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def render_service_account(job: ResilientTrainingJob, *, uid: str | None = None) -> list[dict[str, Any]]:
    """The job's own ServiceAccount, bound to no Role and without a token mounted: the trainer calls
    no Kubernetes API, and a compromised worker must not be able to change any pod (its own
    sibling's image, say). An account of its own, rather than the namespace's `default`, keeps
    whatever a cluster grants `default` away from the trainer, and gives IRSA or Pod Identity a
    place to attach cloud credentials."""
    owner = job_uid(job, uid)
    name = names.trainer_name(job.name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": object_metadata(job, name, owner),
            "automountServiceAccountToken": False,
        }
    ]
