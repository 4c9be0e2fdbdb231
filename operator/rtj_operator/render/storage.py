"""The checkpoint's storage (the claim, FSx's static volume, the directory's init container) and
the trainer's volumes and mounts, the writable scratch paths of a read-only root filesystem
included."""

from __future__ import annotations

from typing import Any

from rtj_contract import env as env_names

from rtj_operator import constants, names
from rtj_operator.api import (
    CHECKPOINT_VOLUME,
    FT_LAUNCHER_CONFIG_MOUNT_PATH,
    FT_LAUNCHER_CONFIG_VOLUME,
    SCRATCH_VOLUME,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
    ResilientTrainingJob,
    RetentionPolicy,
)
from rtj_operator.profiles import resolve_sizing
from rtj_operator.render.meta import checkpoint_claim_name, ft_launcher_config_map, job_uid, object_metadata
from rtj_operator.render.placement import volume_zone_affinity
from rtj_operator.render.pod_runtime import LAUNCH_COMMAND, runtime_mounts, runtime_volumes

# rtj-launch's init-container mode (rtj_trainer.runtime.launch): prepare the job's checkpoint directory.
PREPARE_CHECKPOINT_DIR_ARG = "--prepare-checkpoint-dir"


# The root filesystem of a trainer container is read-only; these are where it may write, each a
# subdirectory of one disk-backed emptyDir: ft_launcher's IPC sockets, torch.compile/inductor caches
# and Python's temporary files go to /tmp; Triton's cache (~/.triton), CUDA's JIT cache (~/.nv) and
# anything else under HOME to SCRATCH_HOME, which the pod's HOME points at.
SCRATCH_HOME = "/home/rtj"


SCRATCH_MOUNTS = (("/tmp", "tmp"), (SCRATCH_HOME, "home"))


SCRATCH_SIZE_LIMIT = "16Gi"


def trainer_volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    sizing = resolve_sizing(job.spec.instance_type, job.spec.resources)
    return [
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": checkpoint_claim_name(job)}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": sizing.shm_size}},
        scratch_volume(),
        *_ft_launcher_config_volumes(job),
        *runtime_volumes(job),
        *(v.model_dump(by_alias=True, exclude_none=True, mode="json") for v in job.spec.volumes),
    ]


def trainer_volume_mounts(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    ft_launcher_config = [
        {"name": FT_LAUNCHER_CONFIG_VOLUME, "mountPath": FT_LAUNCHER_CONFIG_MOUNT_PATH, "readOnly": True}
    ]
    return [
        {"name": CHECKPOINT_VOLUME, "mountPath": job.spec.checkpoint.mount_path},
        {"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH},
        *_scratch_mounts(job),
        *(ft_launcher_config if ft_launcher_config_map(job) is not None else []),
        *runtime_mounts(job),
        *(m.model_dump(by_alias=True, exclude_none=True, mode="json") for m in job.spec.volume_mounts),
    ]


def _ft_launcher_config_volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """The ConfigMap of spec.faultTolerance.ftLauncher.configMap, its one key as a file of that name (a
    missing ConfigMap or key holds the pod in ContainerCreating until it exists)."""
    config_map = ft_launcher_config_map(job)
    if config_map is None:
        return []
    source = {"name": config_map.name, "items": [{"key": config_map.key, "path": config_map.key}]}
    return [{"name": FT_LAUNCHER_CONFIG_VOLUME, "configMap": source}]


def scratch_volume() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": SCRATCH_SIZE_LIMIT}}


def _scratch_mounts(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """The writable paths of a read-only root filesystem, except those the job mounts itself."""
    taken = {m.mount_path.rstrip("/") for m in job.spec.volume_mounts}
    taken.add(job.spec.checkpoint.mount_path.rstrip("/"))
    return [
        {"name": SCRATCH_VOLUME, "mountPath": path, "subPath": sub}
        for path, sub in SCRATCH_MOUNTS
        if path not in taken
    ]


def checkpoint_dir_init_container(job: ResilientTrainingJob) -> dict[str, Any] | None:
    """Creates ``<mountPath>/<job>`` owned by the trainer's user (``rtj_trainer.runtime.checkpoint_dir``).

    A fresh FSx for Lustre root belongs to root, and the FSx CSI driver ignores fsGroup on
    ReadWriteMany volumes: only root can create the job's directory. So this one step runs as root,
    with CAP_CHOWN and CAP_FOWNER alone, and touches nothing but that directory.
    """
    spec = job.spec
    if not spec.checkpoint.prepare_directory:
        return None
    owner = f"{constants.TRAINER_UID}:{constants.TRAINER_GID}"
    directory = names.checkpoint_dir(job.name, spec.checkpoint.mount_path)
    return {
        "name": names.CHECKPOINT_INIT_CONTAINER_NAME,
        "image": spec.runtime_image or spec.image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": [LAUNCH_COMMAND, PREPARE_CHECKPOINT_DIR_ARG],
        "env": [
            {"name": env_names.CHECKPOINT_DIR, "value": directory},
            {"name": env_names.CHECKPOINT_DIR_OWNER, "value": owner},
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
        },
        "volumeMounts": [{"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path}],
    }  # fmt: skip


def render_storage(job: ResilientTrainingJob, *, uid: str | None = None) -> list[dict[str, Any]]:
    """The checkpoint PVC (and the static PV for FSx); nothing when an existing claim is named."""
    ckpt = job.spec.checkpoint
    storage = ckpt.storage
    if storage.existing_claim is not None:
        return []
    owner = job_uid(job, uid) if ckpt.retention_policy is RetentionPolicy.DELETE else None
    objects: list[dict[str, Any]] = []
    claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"]}
    if storage.fsx_static is not None:
        fsx = storage.fsx_static
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                # Cluster-scoped: never owned by a namespaced job; Retain keeps the file system's data.
                "metadata": object_metadata(job, names.pv_name(job.name, job.namespace), None,
                                            namespaced=False),
                "spec": {
                    "capacity": {"storage": fsx.capacity},
                    "volumeMode": "Filesystem",
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                 "namespace": job.namespace, "name": names.pvc_name(job.name)},
                    "csi": {
                        "driver": "fsx.csi.aws.com",
                        "volumeHandle": fsx.file_system_id,
                        "volumeAttributes": {"dnsname": fsx.dns_name, "mountname": fsx.mount_name},
                    },
                    **volume_zone_affinity(job),
                },
            }
        )  # fmt: skip
        claim_spec.update(
            {
                "storageClassName": "",
                "volumeName": names.pv_name(job.name, job.namespace),
                "resources": {"requests": {"storage": fsx.capacity}},
            }
        )
    elif storage.dynamic is not None:
        dynamic = storage.dynamic
        if dynamic.storage_class_name is not None:
            claim_spec["storageClassName"] = dynamic.storage_class_name
        claim_spec["resources"] = {"requests": {"storage": dynamic.capacity}}
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": object_metadata(job, names.pvc_name(job.name), owner),
            "spec": claim_spec,
        }
    )
    return objects
