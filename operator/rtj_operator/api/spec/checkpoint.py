"""spec.checkpoint: the interval, mode and retention of checkpoints and the storage they go to
(FSx for Lustre, a dynamic claim or an existing one)."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, Strict

from rtj_operator import constants
from rtj_operator.api.corev1 import AbsolutePath, Name, OptionalName, PositiveQuantity
from rtj_operator.api.schema import ApiModel, CelRule, Flag, Immutable, Int32
from rtj_operator.api.spec.common import LIBRARY_ONLY_NOTE, ZONE_LABEL, AvailabilityZone

FileSystemId = Annotated[str, Strict(), Field(max_length=32, pattern=r"^fs-[0-9a-f]{8,17}$")]


MountName = Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_]+$")]


MAX_MEMORY_INTERVAL_STEPS: int = 1_000_000


class CheckpointMode(enum.StrEnum):
    # Async: shards are copied to a staging buffer and written by a background process.
    ASYNC = "Async"
    # Sync: training waits while every shard is written.
    SYNC = "Sync"


class RetentionPolicy(enum.StrEnum):
    # Retain: the checkpoint claim outlives the job (it carries no owner reference).
    RETAIN = "Retain"
    # Delete: the claim is owned by the job and garbage-collected with it.
    DELETE = "Delete"


class FsxStaticStorage(ApiModel):
    """An existing FSx for Lustre file system, bound through a static PersistentVolume."""

    file_system_id: FileSystemId = Field(
        description="fileSystemId is the FSx for Lustre file system id (fs-...). Required."
    )
    dns_name: Name = Field(description="dnsName is the file system's DNS name. Required.")
    mount_name: MountName = Field(description="mountName is the file system's mount name. Required.")
    capacity: PositiveQuantity = Field(
        default="1200Gi",
        description="capacity is the volume's size (a positive quantity). Optional; default: 1200Gi.",
    )
    availability_zone: AvailabilityZone | None = Field(
        default=None,
        description=(
            "availabilityZone is the file system's availability zone (e.g. us-east-1a): the "
            f"PersistentVolume's node affinity and every pod's require it ({ZONE_LABEL}). Optional; "
            "default: the scheduler chooses (see scheduling.sameTopology)."
        ),
    )


class DynamicStorage(ApiModel):
    """A claim provisioned by a StorageClass (for example the FSx CSI driver's dynamic provisioning)."""

    storage_class_name: OptionalName | None = Field(
        default=None,
        description="storageClassName is the claim's StorageClass (a DNS subdomain; empty for none). "
        "Optional; default: the cluster default.",
    )
    capacity: PositiveQuantity = Field(
        default="1200Gi",
        description="capacity is the requested size (a positive quantity). Optional; default: 1200Gi.",
    )


class ExistingClaimStorage(ApiModel):
    """A PersistentVolumeClaim that exists already, in the job's namespace."""

    claim_name: Name = Field(description="claimName is the claim's name. Required.")


class StorageSpec(ApiModel):
    """Where checkpoints live: exactly one of the options."""

    cel_rules = (
        CelRule(
            rule="[has(self.fsxStatic), has(self.dynamic), has(self.existingClaim)].filter(x, x).size() == 1",
            message="exactly one of fsxStatic, dynamic, existingClaim must be set",
            check=lambda s: [s.fsx_static, s.dynamic, s.existing_claim].count(None) == 2,
        ),
    )

    fsx_static: FsxStaticStorage | None = Field(
        default=None,
        description="fsxStatic binds an existing FSx for Lustre file system. Optional; one of three.",
    )
    dynamic: DynamicStorage | None = Field(
        default=None, description="dynamic provisions a claim from a StorageClass. Optional; one of three."
    )
    existing_claim: ExistingClaimStorage | None = Field(
        default=None, description="existingClaim uses a claim that exists already. Optional; one of three."
    )


class CheckpointSpec(ApiModel):
    """Checkpointing: where and how often."""

    mount_path: Annotated[AbsolutePath, Immutable()] = Field(
        default="/checkpoints",
        description=(
            "mountPath is where the checkpoint volume is mounted; the job writes under "
            "<mountPath>/<job name>. Optional; default: /checkpoints. Immutable."
        ),
    )
    interval_steps: Int32 = Field(
        default=100,
        ge=1,
        le=100_000_000,
        description=f"intervalSteps is the number of steps between checkpoints. Optional; default: 100. "
        f"{LIBRARY_ONLY_NOTE}",
    )
    keep: Int32 = Field(
        default=3,
        ge=1,
        le=1000,
        description=f"keep is how many complete checkpoints are kept. Optional; default: 3. "
        f"{LIBRARY_ONLY_NOTE}",
    )
    memory_interval_steps: Int32 = Field(
        default=1,
        ge=0,
        le=MAX_MEMORY_INTERVAL_STEPS,
        description=(
            "memoryIntervalSteps is, under faultTolerance.launcher Supervisor, the number of steps between "
            "copies of each rank's state into host memory and to a peer rank on another node (the memory "
            "tier): a reserve rank that takes over a lost rank resumes from that copy, losing no step when "
            "it is taken every step; the cost is a copy of the rank's local state through host memory "
            "and the network per interval, and the host memory to hold a peer's copy. 0 turns it off "
            "(recovery resumes from the newest checkpoint). Ignored under FtLauncher. Optional; default: 1. "
            f"{LIBRARY_ONLY_NOTE}"
        ),
    )
    mode: CheckpointMode = Field(
        default=CheckpointMode.ASYNC,
        description=(
            "mode is Async (shards staged in memory and written in the background) or Sync. "
            f"Optional; default: Async. {LIBRARY_ONLY_NOTE}"
        ),
    )
    retention_policy: RetentionPolicy = Field(
        default=RetentionPolicy.RETAIN,
        description=(
            "retentionPolicy is what deleting the job does to the checkpoint claim: Retain keeps it, Delete "
            "removes it with the job. Optional; default: Retain."
        ),
    )
    prepare_directory: Flag = Field(
        default=True,
        description=(
            "prepareDirectory renders an init container that creates <mountPath>/<job name> owned by the "
            f"trainer's user ({constants.TRAINER_UID}:{constants.TRAINER_GID}), running as root with "
            "CAP_CHOWN and CAP_FOWNER only: a fresh FSx for Lustre file system's root belongs to root and "
            "its CSI driver ignores fsGroup. Set false where an admission policy forbids root containers "
            "and the directory is prepared otherwise. Optional; default: true."
        ),
    )
    storage: Annotated[StorageSpec, Immutable()] = Field(
        description="storage is where checkpoints live: exactly one of fsxStatic, dynamic, existingClaim. "
        "Required. Immutable."
    )
