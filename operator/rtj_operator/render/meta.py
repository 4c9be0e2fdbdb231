"""What every child of the job shares: its shape (launcher, store pod, spares, slots), labels,
owner references and metadata."""

from __future__ import annotations

from typing import Any

from rtj_operator import constants, names
from rtj_operator.api import FtLauncherConfigMap, Launcher, ResilientTrainingJob
from rtj_operator.api import has_store_pod as api_has_store_pod
from rtj_operator.api import spares_in_training as api_spares_in_training

# Where the kubelet reads a container's termination message (Kubernetes' default path).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def is_supervisor(job: ResilientTrainingJob) -> bool:
    """Whether the job runs under faultTolerance.launcher Supervisor (one world, a store pod)."""
    return job.spec.fault_tolerance.launcher is Launcher.SUPERVISOR


def has_store_pod(job: ResilientTrainingJob) -> bool:
    """Whether the job runs a store pod (Supervisor's world stores, or FtLauncher's rendezvous on
    rendezvous.host StorePod): `rtj_operator.api.has_store_pod`."""
    return api_has_store_pod(job.spec)


def spares_in_training(job: ResilientTrainingJob) -> bool:
    """Whether the hot spares take part in the training (Supervisor's reserve ranks, FtLauncher's
    standby nodes): `rtj_operator.api.spares_in_training`."""
    return api_spares_in_training(job.spec)


def nnodes_max(job: ResilientTrainingJob) -> int:
    """The most nodes in ft_launcher's rendezvous: the workers, and the spares when they stand by in it."""
    return job.spec.nodes + (job.spec.hot_spares if spares_in_training(job) else 0)


def slot(job: ResilientTrainingJob, role: str, index: int) -> int:
    """A pod's slot where the spares take part in the training (Supervisor's world, FtLauncher's
    rendezvous with standby spares): worker i is slot i, spare k is slot nodes + k."""
    return index if role == constants.ROLE_WORKER else job.spec.nodes + index


def checkpoint_claim_name(job: ResilientTrainingJob) -> str:
    """The claim the pods mount: the existing claim if one is named, else the rendered one."""
    existing = job.spec.checkpoint.storage.existing_claim
    return existing.claim_name if existing is not None else names.pvc_name(job.name)


def job_labels(job: ResilientTrainingJob) -> dict[str, str]:
    return {
        constants.LABEL_JOB: job.name,
        constants.LABEL_APP_NAME: constants.APP_NAME,
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
    }


def owner_references(job: ResilientTrainingJob, uid: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": constants.API_VERSION,
            "kind": constants.KIND,
            "name": job.name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def object_metadata(
    job: ResilientTrainingJob, name: str, uid: str | None, *, namespaced: bool = True
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = job.namespace
    meta["labels"] = job_labels(job)
    if uid is not None:
        meta["ownerReferences"] = owner_references(job, uid)
    return meta


def job_uid(job: ResilientTrainingJob, uid: str | None) -> str:
    resolved = uid or job.metadata.uid
    if not resolved:
        raise ValueError(f"job {job.namespace}/{job.name} has no uid: pass uid= (owner references need one)")
    return resolved


def ft_launcher_config_map(job: ResilientTrainingJob) -> FtLauncherConfigMap | None:
    ft_launcher = job.spec.fault_tolerance.ft_launcher
    return ft_launcher.config_map if ft_launcher is not None else None
