"""The ResilientTrainingJob API (``resilient.training/v1alpha1``): pydantic models and the CRD made from them.

The models here are the single source of the schema. :func:`crd` walks them to build the
CustomResourceDefinition (a structural OpenAPI v3 schema with defaults, user-facing descriptions and CEL
rules); :func:`parse_job` validates a job body in Python with the same rules, for objects that never
passed an API server's validation. Each cross-field rule is declared once, as a :class:`CelRule` that
carries both its CEL expression (for the API server) and a Python predicate (for :func:`parse_job`), so
the two cannot drift apart. :mod:`rtj_operator.render` turns a parsed job into its child objects and
:mod:`rtj_operator.profiles` sizes its pods; the operator writes status through the status models here.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Self

import annotated_types
import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from rtj_operator import constants
from rtj_operator.validation import JobValidationError, RuleViolationError, format_validation_error

__all__ = [
    "KNOWN_INSTANCE_TYPES",
    "CelRule",
    "CheckpointMode",
    "CheckpointSpec",
    "CheckpointStatus",
    "Condition",
    "ConditionStatus",
    "DynamicStorage",
    "EnvVar",
    "ExcludedNode",
    "ExistingClaimStorage",
    "FailurePolicy",
    "FaultTolerance",
    "FsxStaticStorage",
    "ImagePullPolicy",
    "InProcessRestart",
    "JobState",
    "JobValidationError",
    "NodeFault",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ObjectMeta",
    "PodStatus",
    "ProgressStatus",
    "RendezvousSpec",
    "ResilientTrainingJob",
    "ResilientTrainingJobSpec",
    "ResilientTrainingJobStatus",
    "ResourceOverrides",
    "RestartsStatus",
    "RetentionPolicy",
    "SchedulingSpec",
    "StorageSpec",
    "Toleration",
    "Volume",
    "VolumeMount",
    "WorkersStatus",
    "check_update",
    "crd",
    "crd_yaml",
    "parse_job",
]

# Instance types with a built-in sizing profile (rtj_operator.profiles keeps the figures). Any other
# type is accepted when spec.resources gives at least cpu and memory.
KNOWN_INSTANCE_TYPES: tuple[str, ...] = (
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p4d.24xlarge",
    "cpu",
)

# Volume names the renderer uses itself; user volumes may not take them.
CHECKPOINT_VOLUME: str = "rtj-checkpoints"
SHM_VOLUME: str = "rtj-shm"
SHM_MOUNT_PATH: str = "/dev/shm"

# A job's name becomes its Service name (a DNS-1035 label) and the prefix of its pods' hostnames
# `<name>-worker-<i>` (DNS labels, at most 63 characters, with i < 1024): hence 50 characters.
MAX_JOB_NAME_LENGTH: int = 50
JOB_NAME_PATTERN: str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Kubernetes' own grammar for resource quantities (apimachinery resource.Quantity).
QUANTITY_PATTERN: str = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


# --- schema markers -----------------------------------------------------------------------------------
# Annotated[...] metadata that the CRD walker understands; pydantic ignores them.


@dataclass(frozen=True, eq=False)  # hashed by identity: typing hashes Annotated metadata in unions
class SchemaExtra:
    """Extra OpenAPI keywords for one schema node (a format, a list type, ...)."""

    keywords: Mapping[str, Any]


@dataclass(frozen=True)
class Immutable:
    """The field may not change once the object exists (CEL ``self == oldSelf``)."""


class CelRule(NamedTuple):
    """A validation rule of one object, in CEL for the API server and in Python for :func:`parse_job`.

    ``field_path`` (relative, like ``.heartbeatTimeoutSeconds``) names the field a violation is
    reported on, in both places.
    """

    rule: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""


Int32 = Annotated[int, Strict()]
Int64 = Annotated[int, Strict(), SchemaExtra({"format": "int64"})]
Flag = Annotated[bool, Strict()]
DateTime = Annotated[str, SchemaExtra({"format": "date-time"})]


# Every string has a maxLength: the API server's CEL cost estimate needs one.
Name = Annotated[str, Strict(), Field(min_length=1, max_length=253)]
OptionalName = Annotated[str, Strict(), Field(max_length=253)]
DnsLabel = Annotated[str, Strict(), Field(min_length=1, max_length=63)]
Quantity = Annotated[str, Strict(), Field(max_length=64, pattern=QUANTITY_PATTERN)]
LabelKey = Annotated[str, Strict(), Field(min_length=1, max_length=317)]
TaintKey = Annotated[str, Strict(), Field(max_length=317)]
LabelValue = Annotated[str, Strict(), Field(max_length=63)]
AnnotationValue = Annotated[str, Strict(), Field(max_length=4096)]
Arg = Annotated[str, Strict(), Field(max_length=4096)]
Image = Annotated[str, Strict(), Field(min_length=1, max_length=1024)]
EnvName = Annotated[str, Strict(), Field(min_length=1, max_length=256)]
EnvValue = Annotated[str, Strict(), Field(max_length=32768)]
MountPath = Annotated[str, Strict(), Field(min_length=1, max_length=256)]
AbsolutePath = Annotated[str, Strict(), Field(max_length=256, pattern=r"^/.+")]
FileSystemId = Annotated[str, Strict(), Field(max_length=32, pattern=r"^fs-[0-9a-f]{8,17}$")]
MountName = Annotated[str, Strict(), Field(min_length=1, max_length=64)]


class _ApiModel(BaseModel):
    """Base of the spec models: camelCase JSON names, unknown fields rejected, CEL rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid", frozen=True
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in type(self).cel_rules:
            if not rule.check(self):
                raise RuleViolationError(rule.message, rule.field_path)
        return self


class _StatusModel(BaseModel):
    """Base of the status models: camelCase JSON names; unknown fields ignored (other writers exist)."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="ignore"
    )


# --- enums ----------------------------------------------------------------------------------------------


class ImagePullPolicy(enum.StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


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


class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class NodeSelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class JobState(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


# --- spec -------------------------------------------------------------------------------------------------


class ResourceOverrides(_ApiModel):
    """Overrides of the instance profile's pod sizing."""

    gpus: Int32 | None = Field(
        default=None,
        ge=0,
        le=64,
        description="gpus is the nvidia.com/gpu count per pod. Optional; default: the profile's.",
    )
    efa_adapters: Int32 | None = Field(
        default=None,
        ge=0,
        le=64,
        description="efaAdapters is the vpc.amazonaws.com/efa count per pod. "
        "Optional; default: the profile's.",
    )
    cpu: Quantity | None = Field(
        default=None,
        description="cpu is the CPU request per pod (a quantity). Optional; default: the profile's.",
    )
    memory: Quantity | None = Field(
        default=None,
        description="memory is the memory request and limit per pod (a quantity). "
        "Optional; default: the profile's.",
    )
    hugepages2_mi: Quantity | None = Field(
        default=None,
        alias="hugepages2Mi",
        description=(
            'hugepages2Mi is the hugepages-2Mi request and limit per pod (a quantity; "0" for none). '
            "Optional; default: the profile's."
        ),
    )
    shm_size: Quantity | None = Field(
        default=None,
        description=(
            "shmSize is the size limit of the memory-backed /dev/shm volume (a quantity). "
            "Optional; default: the profile's."
        ),
    )


class Toleration(_ApiModel):
    """A Kubernetes toleration, added to the ones the operator renders."""

    key: TaintKey | None = Field(
        default=None, description="key is the taint key the toleration matches. Optional."
    )
    operator: TolerationOperator | None = Field(
        default=None, description="operator is Exists or Equal. Optional; Kubernetes defaults it to Equal."
    )
    value: LabelValue | None = Field(
        default=None, description="value is the taint value matched by Equal. Optional."
    )
    effect: TaintEffect | None = Field(
        default=None,
        description="effect is NoSchedule, PreferNoSchedule or NoExecute. Optional; empty matches all.",
    )
    toleration_seconds: Int64 | None = Field(
        default=None,
        description="tolerationSeconds bounds how long a NoExecute taint is tolerated. Optional.",
    )


class NodeSelectorRequirement(_ApiModel):
    """One node-label requirement of a node affinity term."""

    key: LabelKey = Field(description="key is the node label key. Required.")
    operator: NodeSelectorOperator = Field(
        description="operator is one of In, NotIn, Exists, DoesNotExist, Gt, Lt. Required."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=64,
        description="values are the label values In/NotIn compare with (one integer for Gt/Lt). Optional.",
    )


class NodeSelectorTerm(_ApiModel):
    """A node selector term: all of its requirements must hold."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        min_length=1,
        max_length=16,
        description="matchExpressions are node-label requirements, all of which must hold. Required.",
    )


class SchedulingSpec(_ApiModel):
    """Where the job's pods may run, in addition to the instance-type affinity the operator renders."""

    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="nodeSelector is added to every pod's nodeSelector. Optional; default: empty.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "tolerations are added to the rendered ones (nvidia.com/gpu, and node not-ready/unreachable "
            "for failurePolicy.nodeLossGraceSeconds). Optional; default: empty."
        ),
    )
    required_node_affinity_terms: list[NodeSelectorTerm] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "requiredNodeAffinityTerms are node selector terms, one of which a node must satisfy; the "
            "instance-type and excluded-node requirements are added to each. Optional; default: empty."
        ),
    )
    priority_class_name: OptionalName | None = Field(
        default=None, description="priorityClassName is the pods' PriorityClass. Optional."
    )


class RendezvousSpec(_ApiModel):
    """The c10d rendezvous that worker 0 hosts."""

    port: Int32 = Field(
        default=29500,
        ge=1,
        le=65535,
        description="port is the rendezvous (c10d store) port on worker 0. Optional; default: 29500.",
    )


class FsxStaticStorage(_ApiModel):
    """An existing FSx for Lustre file system, bound through a static PersistentVolume."""

    file_system_id: FileSystemId = Field(
        description="fileSystemId is the FSx for Lustre file system id (fs-...). Required."
    )
    dns_name: Name = Field(description="dnsName is the file system's DNS name. Required.")
    mount_name: MountName = Field(description="mountName is the file system's mount name. Required.")
    capacity: Quantity = Field(
        default="1200Gi", description="capacity is the volume's size. Optional; default: 1200Gi."
    )


class DynamicStorage(_ApiModel):
    """A claim provisioned by a StorageClass (for example the FSx CSI driver's dynamic provisioning)."""

    storage_class_name: OptionalName | None = Field(
        default=None,
        description="storageClassName is the claim's StorageClass. Optional; default: the cluster default.",
    )
    capacity: Quantity = Field(
        default="1200Gi", description="capacity is the requested size. Optional; default: 1200Gi."
    )


class ExistingClaimStorage(_ApiModel):
    """A PersistentVolumeClaim that exists already, in the job's namespace."""

    claim_name: Name = Field(description="claimName is the claim's name. Required.")


class StorageSpec(_ApiModel):
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


class CheckpointSpec(_ApiModel):
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
        description="intervalSteps is the number of steps between checkpoints. Optional; default: 100.",
    )
    keep: Int32 = Field(
        default=3,
        ge=1,
        le=1000,
        description="keep is how many complete checkpoints are kept. Optional; default: 3.",
    )
    mode: CheckpointMode = Field(
        default=CheckpointMode.ASYNC,
        description=(
            "mode is Async (shards staged in memory and written in the background) or Sync. "
            "Optional; default: Async."
        ),
    )
    retention_policy: RetentionPolicy = Field(
        default=RetentionPolicy.RETAIN,
        description=(
            "retentionPolicy is what deleting the job does to the checkpoint claim: Retain keeps it, Delete "
            "removes it with the job. Optional; default: Retain."
        ),
    )
    storage: Annotated[StorageSpec, Immutable()] = Field(
        description="storage is where checkpoints live: exactly one of fsxStatic, dynamic, existingClaim. "
        "Required. Immutable."
    )


class InProcessRestart(_ApiModel):
    """NVRx in-process restart: recovery inside the running interpreter."""

    cel_rules = (
        CelRule(
            rule="self.hardTimeoutSeconds > self.softTimeoutSeconds",
            message="hardTimeoutSeconds must be greater than softTimeoutSeconds",
            check=lambda s: s.hard_timeout_seconds > s.soft_timeout_seconds,
            field_path=".hardTimeoutSeconds",
        ),
    )

    enabled: Flag = Field(
        default=True, description="enabled turns in-process restarts on. Optional; default: true."
    )
    max_iterations: Int32 = Field(
        default=10,
        ge=1,
        description="maxIterations is the number of in-process restarts before giving up to the launcher. "
        "Optional; default: 10.",
    )
    soft_timeout_seconds: Int32 = Field(
        default=60,
        ge=1,
        description="softTimeoutSeconds is how long a rank may make no progress before it is interrupted. "
        "Optional; default: 60.",
    )
    hard_timeout_seconds: Int32 = Field(
        default=90,
        ge=1,
        description="hardTimeoutSeconds is how long a rank may make no progress before it is terminated; "
        "greater than softTimeoutSeconds. Optional; default: 90.",
    )
    barrier_timeout_seconds: Int32 = Field(
        default=120,
        ge=1,
        description="barrierTimeoutSeconds bounds the restart barrier among ranks. Optional; default: 120.",
    )


class FaultTolerance(_ApiModel):
    """ft_launcher heartbeats and restarts, and in-process restarts."""

    cel_rules = (
        CelRule(
            rule="self.initialHeartbeatTimeoutSeconds >= self.heartbeatTimeoutSeconds",
            message="initialHeartbeatTimeoutSeconds must be at least heartbeatTimeoutSeconds",
            check=lambda s: s.initial_heartbeat_timeout_seconds >= s.heartbeat_timeout_seconds,
            field_path=".initialHeartbeatTimeoutSeconds",
        ),
        CelRule(
            rule="self.monitorIntervalSeconds < self.heartbeatTimeoutSeconds",
            message="monitorIntervalSeconds must be less than heartbeatTimeoutSeconds",
            check=lambda s: s.monitor_interval_seconds < s.heartbeat_timeout_seconds,
            field_path=".monitorIntervalSeconds",
        ),
        CelRule(
            rule=(
                "!has(self.inProcess) || !self.inProcess.enabled || "
                "self.heartbeatTimeoutSeconds > self.inProcess.hardTimeoutSeconds"
            ),
            message=(
                "heartbeatTimeoutSeconds must be greater than inProcess.hardTimeoutSeconds while in-process "
                "restarts are enabled (an in-process restart must finish before the launcher declares a hang)"
            ),
            check=lambda s: (
                (not s.in_process.enabled) or s.heartbeat_timeout_seconds > s.in_process.hard_timeout_seconds
            ),
            field_path=".heartbeatTimeoutSeconds",
        ),
    )

    heartbeat_timeout_seconds: Int32 = Field(
        default=300,
        ge=1,
        description="heartbeatTimeoutSeconds is how long a rank may miss heartbeats before ft_launcher "
        "restarts the workers. Optional; default: 300.",
    )
    initial_heartbeat_timeout_seconds: Int32 = Field(
        default=600,
        ge=1,
        description="initialHeartbeatTimeoutSeconds is the heartbeat timeout before a rank's first "
        "heartbeat; at least heartbeatTimeoutSeconds. Optional; default: 600.",
    )
    monitor_interval_seconds: Int32 = Field(
        default=5,
        ge=1,
        description="monitorIntervalSeconds is how often ft_launcher checks its workers; less than "
        "heartbeatTimeoutSeconds. Optional; default: 5.",
    )
    max_in_job_restarts: Int32 = Field(
        default=20,
        ge=0,
        description="maxInJobRestarts is the number of worker-process restarts ft_launcher makes before the "
        "pod fails. Optional; default: 20.",
    )
    in_process: InProcessRestart = Field(
        default_factory=InProcessRestart,
        description="inProcess configures NVRx in-process restarts. Optional; default: enabled.",
    )


class FailurePolicy(_ApiModel):
    """What the operator does when pods or nodes fail."""

    node_loss_grace_seconds: Int32 = Field(
        default=10,
        ge=0,
        le=3600,
        description="nodeLossGraceSeconds is how long a node may be NotReady or unreachable before its "
        "worker is replaced; also the pods' tolerationSeconds for those taints. Optional; default: 10.",
    )
    max_node_replacements: Int32 = Field(
        default=10,
        ge=0,
        description="maxNodeReplacements is the number of pod replacements before the job is Failed. "
        "Optional; default: 10.",
    )
    backoff_seconds: Int32 = Field(
        default=5,
        ge=0,
        le=3600,
        description="backoffSeconds is the delay before a replacement after the previous one. "
        "Optional; default: 5.",
    )
    repeat_offender_threshold: Int32 = Field(
        default=2,
        ge=1,
        description="repeatOffenderThreshold is the number of faults on one node before the node is excluded "
        "for the job. Optional; default: 2.",
    )
    taint_excluded_nodes: Flag = Field(
        default=False,
        description="taintExcludedNodes makes the operator taint excluded nodes cluster-wide "
        f"({constants.TAINT_EXCLUDED}:NoSchedule). Optional; default: false.",
    )


class EnvVar(_ApiModel):
    """An environment variable of the worker container."""

    cel_rules = (
        CelRule(
            rule="!(has(self.value) && has(self.valueFrom))",
            message="value and valueFrom are mutually exclusive",
            check=lambda s: s.value is None or s.value_from is None,
        ),
    )

    name: EnvName = Field(description="name is the variable's name. Required.")
    value: EnvValue | None = Field(default=None, description="value is the variable's value. Optional.")
    value_from: (
        Annotated[dict[str, Any], SchemaExtra({"x-kubernetes-preserve-unknown-fields": True})] | None
    ) = Field(default=None, description="valueFrom is a Kubernetes EnvVarSource. Optional.")


class Volume(_ApiModel):
    """An extra pod volume: a Kubernetes Volume, kept as given apart from its name."""

    model_config = ConfigDict(extra="allow")

    name: DnsLabel = Field(description="name is the volume's name. Required.")


class VolumeMount(_ApiModel):
    """A mount of an extra volume into the worker container (other VolumeMount fields are kept as given)."""

    model_config = ConfigDict(extra="allow")

    name: DnsLabel = Field(description="name is the mounted volume's name. Required.")
    mount_path: MountPath = Field(description="mountPath is where it is mounted. Required.")


def _immutable_when_set(field: str) -> CelRule:
    """Immutability of an optional field without a default: adding or removing it is a change too."""
    return CelRule(
        rule=(
            f"has(self.{field}) == has(oldSelf.{field}) && "
            f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
        ),
        message=f"{field} is immutable",
        check=lambda _s: True,  # a transition rule: check_update() enforces it in Python
        field_path=f".{field}",
    )


class ResilientTrainingJobSpec(_ApiModel):
    """The desired state of a ResilientTrainingJob."""

    cel_rules = (
        CelRule(
            rule=(
                f"self.instanceType in {list(KNOWN_INSTANCE_TYPES)!r} || "
                "(has(self.resources) && has(self.resources.cpu) && has(self.resources.memory))"
            ),
            message=(
                "resources.cpu and resources.memory must be set for an instanceType without a built-in "
                "profile"
            ),
            check=lambda s: (
                s.instance_type in KNOWN_INSTANCE_TYPES
                or (s.resources.cpu is not None and s.resources.memory is not None)
            ),
            field_path=".resources",
        ),
        CelRule(
            rule=(
                "!has(self.volumes) || "
                f"self.volumes.all(v, !(v.name in ['{CHECKPOINT_VOLUME}', '{SHM_VOLUME}']))"
            ),
            message=f"volume names {CHECKPOINT_VOLUME} and {SHM_VOLUME} are reserved",
            check=lambda s: all(v.name not in (CHECKPOINT_VOLUME, SHM_VOLUME) for v in s.volumes),
            field_path=".volumes",
        ),
        CelRule(
            rule=(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, "
                "has(self.volumes) && self.volumes.exists(v, v.name == m.name))"
            ),
            message="every volumeMounts entry must name a volume of volumes",
            check=lambda s: all(any(v.name == m.name for v in s.volumes) for m in s.volume_mounts),
            field_path=".volumeMounts",
        ),
        CelRule(
            rule=(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, "
                f"m.mountPath != self.checkpoint.mountPath && m.mountPath != '{SHM_MOUNT_PATH}')"
            ),
            message=f"volumeMounts may not use checkpoint.mountPath or {SHM_MOUNT_PATH}",
            check=lambda s: all(
                m.mount_path not in (s.checkpoint.mount_path, SHM_MOUNT_PATH) for m in s.volume_mounts
            ),
            field_path=".volumeMounts",
        ),
        CelRule(
            rule=f"!has(self.podLabels) || self.podLabels.all(k, !k.startsWith('{constants.GROUP}/'))",
            message=f"podLabels may not use the reserved prefix {constants.GROUP}/",
            check=lambda s: not any(k.startswith(f"{constants.GROUP}/") for k in s.pod_labels),
            field_path=".podLabels",
        ),
        _immutable_when_set("processesPerNode"),
    )

    image: Image = Field(description="image is the trainer image. Required.")
    image_pull_policy: ImagePullPolicy = Field(
        default=ImagePullPolicy.IF_NOT_PRESENT,
        description="imagePullPolicy is Always, IfNotPresent or Never. Optional; default: IfNotPresent.",
    )
    command: list[Arg] = Field(
        default_factory=lambda: ["rtj-train"],
        min_length=1,
        max_length=64,
        description="command is the training program each ft_launcher runs (with --no-python). "
        'Optional; default: ["rtj-train"].',
    )
    args: list[Arg] = Field(
        default_factory=list,
        max_length=256,
        description="args are the training program's arguments. Optional; default: empty.",
    )
    working_dir: Arg | None = Field(
        default=None,
        description="workingDir is the worker container's working directory. Optional; default: the image's.",
    )
    nodes: Annotated[Int32, Immutable()] = Field(
        ge=1,
        le=1024,
        description="nodes is the number of active worker pods, one per node. Required. Immutable.",
    )
    processes_per_node: Int32 | None = Field(
        default=None,
        ge=1,
        le=256,
        description="processesPerNode is the number of training processes per pod. Optional; default: the "
        "profile's GPUs per node (8 on p5), 1 on instance types without GPUs. Immutable.",
    )
    hot_spares: Int32 = Field(
        default=0,
        ge=0,
        le=64,
        description="hotSpares is the number of warm spare pods that hold nodes for fast replacement; they "
        "stay outside the rendezvous. Optional; default: 0.",
    )
    instance_type: Annotated[DnsLabel, Immutable()] = Field(
        default="p5.48xlarge",
        description="instanceType is the node.kubernetes.io/instance-type the pods run on; p5.48xlarge, "
        "p5e.48xlarge, p5en.48xlarge, p4d.24xlarge and cpu have built-in sizing, any other type needs "
        "resources.cpu and resources.memory. Optional; default: p5.48xlarge. Immutable.",
    )
    resources: ResourceOverrides = Field(
        default_factory=ResourceOverrides,
        description="resources overrides the instance profile's pod sizing. "
        "Optional; default: the profile's.",
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="scheduling adds node selection, tolerations and a priority class. Optional.",
    )
    rendezvous: Annotated[RendezvousSpec, Immutable()] = Field(
        default_factory=RendezvousSpec,
        description="rendezvous configures the c10d rendezvous. Optional. Immutable.",
    )
    checkpoint: CheckpointSpec = Field(
        description="checkpoint configures checkpoint storage and cadence. Required."
    )
    fault_tolerance: FaultTolerance = Field(
        default_factory=FaultTolerance,
        description="faultTolerance configures heartbeats, in-job restarts and in-process restarts. "
        "Optional.",
    )
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy,
        description="failurePolicy configures pod replacement, node exclusion and budgets. Optional.",
    )
    suspend: Flag = Field(
        default=False,
        description="suspend deletes the job's pods while true and recreates them when false. "
        "Optional; default: false.",
    )
    ttl_seconds_after_finished: Int32 | None = Field(
        default=None,
        ge=0,
        description="ttlSecondsAfterFinished deletes the job this long after it succeeded or failed. "
        "Optional; default: never.",
    )
    termination_grace_period_seconds: Int64 = Field(
        default=30,
        ge=0,
        le=3600,
        description="terminationGracePeriodSeconds is the pods' grace period on deletion (time to finish an "
        "asynchronous checkpoint). Optional; default: 30.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="env is added to every worker and spare container; entries win over rendered ones of the "
        "same name. Optional; default: empty.",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=32,
        description="volumes are extra pod volumes (Kubernetes Volume objects). Optional; default: empty.",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=32,
        description="volumeMounts mount extra volumes into the worker container. Optional; default: empty.",
    )
    pod_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description=f"podLabels are added to every pod; keys under {constants.GROUP}/ are reserved. "
        "Optional; default: empty.",
    )
    pod_annotations: dict[LabelKey, AnnotationValue] = Field(
        default_factory=dict,
        max_length=32,
        description="podAnnotations are added to every pod. Optional; default: empty.",
    )


# --- status -----------------------------------------------------------------------------------------------


class Condition(_StatusModel):
    """A Kubernetes-style condition."""

    type: str = Field(description="type is Ready, Recovering, Suspended, Succeeded or Failed.")
    status: ConditionStatus = Field(description="status is True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="reason is a CamelCase word for the last transition."
    )
    message: str | None = Field(default=None, description="message is a sentence about the last transition.")
    last_transition_time: DateTime | None = Field(
        default=None, description="lastTransitionTime is when status last changed."
    )
    observed_generation: Int64 | None = Field(
        default=None, description="observedGeneration is the spec generation the condition was set for."
    )


class PodStatus(_StatusModel):
    """One worker or spare pod as the operator last saw it."""

    index: int = Field(description="index is the worker or spare index.")
    role: str = Field(description="role is worker or spare.")
    pod_name: str = Field(description="podName is the pod's name.")
    node_name: str | None = Field(default=None, description="nodeName is the node the pod is bound to.")
    state: str | None = Field(default=None, description="state is the pod's phase or a short summary of it.")


class WorkersStatus(_StatusModel):
    """Counts of the job's pods."""

    desired: int = Field(default=0, description="desired is spec.nodes.")
    ready: int = Field(default=0, description="ready is the number of ready worker pods.")
    ready_spares: int = Field(default=0, description="readySpares is the number of ready spare pods.")
    ready_text: str | None = Field(default=None, description='readyText is "ready/desired", for kubectl.')
    pods: list[PodStatus] = Field(
        default_factory=list, description="pods are the job's worker and spare pods."
    )


class RestartsStatus(_StatusModel):
    """Restarts per recovery layer."""

    in_process: int = Field(
        default=0, description="inProcess counts NVRx in-process restarts (max over pods)."
    )
    in_job: int = Field(default=0, description="inJob counts ft_launcher worker restarts (max over pods).")
    pod_replacement: int = Field(
        default=0, description="podReplacement counts worker pods the operator replaced."
    )
    total: int = Field(default=0, description="total is the sum of the three.")


class ExcludedNode(_StatusModel):
    """A node the job no longer schedules onto."""

    node_name: str = Field(description="nodeName is the excluded node.")
    reason: str | None = Field(default=None, description="reason says why it was excluded.")
    time: DateTime | None = Field(default=None, description="time is when it was excluded.")


class NodeFault(_StatusModel):
    """Faults the job saw on one node."""

    node_name: str = Field(description="nodeName is the node.")
    count: int = Field(default=0, description="count is the number of faults seen on it.")
    last_reason: str | None = Field(default=None, description="lastReason is the newest fault's reason.")
    last_time: DateTime | None = Field(default=None, description="lastTime is the newest fault's time.")


class CheckpointStatus(_StatusModel):
    """The newest complete checkpoint."""

    step: Int64 | None = Field(default=None, description="step is the checkpoint's training step.")
    time: DateTime | None = Field(default=None, description="time is when it was committed.")


class ProgressStatus(_StatusModel):
    """Training progress folded from the pods' reports."""

    step: Int64 | None = Field(default=None, description="step is the newest training step any pod reported.")
    step_time_seconds: float | None = Field(
        default=None, description="stepTimeSeconds is the recent time per step."
    )
    goodput_percent: float | None = Field(
        default=None,
        description="goodputPercent is useful step time over wall time since training started, in percent.",
    )
    update_time: DateTime | None = Field(
        default=None, description="updateTime is when progress was last reported."
    )


class ResilientTrainingJobStatus(_StatusModel):
    """The observed state of a ResilientTrainingJob, written by the operator."""

    observed_generation: Int64 | None = Field(
        default=None, description="observedGeneration is the spec generation the status describes."
    )
    state: JobState | None = Field(
        default=None,
        description="state is Pending, Running, Recovering, Suspended, Succeeded or Failed, derived from the "
        "conditions for kubectl.",
    )
    conditions: Annotated[
        list[Condition],
        SchemaExtra({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
    ] = Field(
        default_factory=list, description="conditions are Ready, Recovering, Suspended, Succeeded, Failed."
    )
    start_time: DateTime | None = Field(
        default=None, description="startTime is when the job's pods were first created."
    )
    completion_time: DateTime | None = Field(
        default=None, description="completionTime is when the job finished."
    )
    workers: WorkersStatus | None = Field(
        default=None, description="workers counts and lists the job's pods."
    )
    restarts: RestartsStatus | None = Field(default=None, description="restarts counts recoveries per layer.")
    excluded_nodes: Annotated[
        list[ExcludedNode],
        SchemaExtra({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["nodeName"]}),
    ] = Field(default_factory=list, description="excludedNodes are nodes the job no longer schedules onto.")
    node_faults: Annotated[
        list[NodeFault],
        SchemaExtra({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["nodeName"]}),
    ] = Field(default_factory=list, description="nodeFaults count faults per node.")
    last_checkpoint: CheckpointStatus | None = Field(
        default=None, description="lastCheckpoint is the newest complete checkpoint."
    )
    progress: ProgressStatus | None = Field(default=None, description="progress is the training progress.")


# --- the object -------------------------------------------------------------------------------------------


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata the operator reads; the rest is ignored."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="ignore", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=JOB_NAME_PATTERN)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ResilientTrainingJob(BaseModel):
    """A ResilientTrainingJob: one FSDP training job kept making progress through faults."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="forbid", frozen=True)

    api_version: Literal["resilient.training/v1alpha1"] = Field(
        description="apiVersion is resilient.training/v1alpha1."
    )
    kind: Literal["ResilientTrainingJob"] = Field(description="kind is ResilientTrainingJob.")
    metadata: ObjectMeta = Field(description="metadata is the standard object metadata.")
    spec: ResilientTrainingJobSpec = Field(description="spec is the desired state of the job.")
    status: ResilientTrainingJobStatus | None = Field(
        default=None, description="status is the observed state."
    )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


# --- parsing ----------------------------------------------------------------------------------------------


def parse_job(body: Mapping[str, Any]) -> ResilientTrainingJob:
    """Validate a ResilientTrainingJob body (as the API server stores it) with the CRD's rules.

    Raises :class:`JobValidationError` whose message names each offending field by its JSON path, e.g.
    ``spec.checkpoint.storage: exactly one of fsxStatic, dynamic, existingClaim must be set``.
    """
    if not isinstance(body, Mapping):
        raise JobValidationError([("", f"a job must be a mapping, not {type(body).__name__}")])
    try:
        return ResilientTrainingJob.model_validate(dict(body), by_alias=True, by_name=False)
    except ValidationError as error:
        raise JobValidationError(format_validation_error(error)) from None


def _immutable_paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, tuple[str, ...]]]:
    """(JSON path, Python attribute path) of every field marked immutable, depth first."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for attr, info in model.model_fields.items():
        key = info.alias or attr
        if any(isinstance(m, Immutable) for m in _all_metadata(info)):
            found.append((f"{prefix}{key}", (attr,)))
        nested = _model_type(info.annotation)
        if nested is not None and issubclass(nested, _ApiModel):
            found += [(path, (attr, *attrs)) for path, attrs in _immutable_paths(nested, f"{prefix}{key}.")]
    for rule in getattr(model, "cel_rules", ()):
        if "oldSelf" in rule.rule and rule.field_path:
            field = rule.field_path.lstrip(".")
            attr = next(a for a, i in model.model_fields.items() if (i.alias or a) == field)
            found.append((f"{prefix}{field}", (attr,)))
    return found


def check_update(old: ResilientTrainingJob, new: ResilientTrainingJob) -> None:
    """Enforce the CRD's transition rules (immutable fields) in Python; raise JobValidationError."""
    problems: list[tuple[str, str]] = []
    for path, attrs in _immutable_paths(ResilientTrainingJobSpec, "spec."):
        before: Any = old.spec
        after: Any = new.spec
        for attr in attrs:
            before, after = getattr(before, attr), getattr(after, attr)
        if before != after:
            problems.append((path, f"{path.rsplit('.', 1)[-1]} is immutable"))
    if problems:
        raise JobValidationError(problems)


# --- CRD generation ---------------------------------------------------------------------------------------


def _all_metadata(info: FieldInfo) -> list[Any]:
    return _flatten_metadata(list(info.metadata))


def _flatten_metadata(items: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for item in items:
        if isinstance(item, FieldInfo):
            flat += _flatten_metadata(list(item.metadata))
        else:
            flat.append(item)
    return flat


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """Strip Annotated and ``| None`` from a type; return the bare type and the Annotated metadata."""
    metadata: list[Any] = []
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            args = typing.get_args(annotation)
            annotation, metadata = args[0], metadata + _flatten_metadata(list(args[1:]))
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                raise TypeError(f"unions other than X | None have no structural schema: {annotation}")
            annotation = members[0]
        else:
            return annotation, metadata


def _model_type(annotation: Any) -> type[BaseModel] | None:
    bare, _ = _unwrap(annotation)
    return bare if isinstance(bare, type) and issubclass(bare, BaseModel) else None


def _constraints(node: dict[str, Any], metadata: list[Any]) -> None:
    """Translate pydantic/annotated-types constraints and schema markers into OpenAPI keywords."""
    kind = str(node.get("type"))
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            node["minimum"] = item.ge
        elif isinstance(item, annotated_types.Le):
            node["maximum"] = item.le
        elif isinstance(item, annotated_types.MinLen):
            if item.min_length:
                node[{"string": "minLength", "array": "minItems", "object": "minProperties"}[kind]] = (
                    item.min_length
                )
        elif isinstance(item, annotated_types.MaxLen):
            node[{"string": "maxLength", "array": "maxItems", "object": "maxProperties"}[kind]] = (
                item.max_length
            )
        elif isinstance(item, SchemaExtra):
            node.update(item.keywords)
        elif getattr(item, "pattern", None) is not None:
            node["pattern"] = item.pattern
        elif isinstance(item, (Immutable, Strict)):
            pass
        elif isinstance(item, (annotated_types.Gt, annotated_types.Lt)):
            raise TypeError("use ge/le: exclusive bounds differ between OpenAPI v3.0 and JSON Schema")


def _type_schema(annotation: Any, metadata: list[Any]) -> dict[str, Any]:
    bare, inner = _unwrap(annotation)
    metadata = inner + metadata
    node: dict[str, Any]
    origin = typing.get_origin(bare)
    if isinstance(bare, type) and issubclass(bare, enum.Enum):
        node = {"type": "string", "enum": [member.value for member in bare]}
    elif origin is Literal:
        node = {"type": "string", "enum": list(typing.get_args(bare))}
    elif bare is bool:
        node = {"type": "boolean"}
    elif bare is int:
        node = {"type": "integer", "format": "int32"}
    elif bare is float:
        node = {"type": "number"}
    elif bare is str:
        node = {"type": "string"}
    elif origin is list:
        (item,) = typing.get_args(bare)
        node = {"type": "array", "items": _type_schema(item, [])}
    elif origin is dict:
        _key, value = typing.get_args(bare)
        node = {"type": "object"}
        if value is not Any:
            node["additionalProperties"] = _type_schema(value, [])
    elif isinstance(bare, type) and issubclass(bare, BaseModel):
        node = _model_schema(bare)
    else:
        raise TypeError(f"no structural schema for {bare!r}")
    _constraints(node, metadata)
    return node


def _default_value(info: FieldInfo) -> Any:
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        # The API server fills nested defaults into an empty object.
        return {}
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    if model is ObjectMeta:
        # A CRD may restrict only metadata.name and metadata.generateName.
        return {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": MAX_JOB_NAME_LENGTH, "pattern": JOB_NAME_PATTERN}
            },
        }
    properties: dict[str, Any] = {}
    required: list[str] = []
    for attr, info in model.model_fields.items():
        key = info.alias or attr
        if info.description is None or not info.description.startswith(f"{key} "):
            raise ValueError(f"{model.__name__}.{attr}: the description must start with {key!r}")
        node: dict[str, Any] = {"description": info.description}
        node.update(_type_schema(info.annotation, _all_metadata(info)))
        if isinstance(info.json_schema_extra, dict):
            node.update(info.json_schema_extra)
        if info.is_required():
            required.append(key)
        else:
            default = _default_value(info)
            if default is not None:
                node["default"] = default
        if any(isinstance(m, Immutable) for m in _all_metadata(info)):
            node.setdefault("x-kubernetes-validations", []).append(
                {"rule": "self == oldSelf", "message": f"{key} is immutable"}
            )
        properties[key] = node
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if model.model_config.get("extra") == "allow":
        schema["x-kubernetes-preserve-unknown-fields"] = True
    rules = getattr(model, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [_cel_rule_json(rule) for rule in rules]
    return schema


def _cel_rule_json(rule: CelRule) -> dict[str, Any]:
    node: dict[str, Any] = {"rule": rule.rule, "message": rule.message}
    if rule.field_path:
        node["fieldPath"] = rule.field_path
    return node


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "State", "type": "string", "jsonPath": ".status.state", "description": "The job's state."},
        {"name": "Nodes", "type": "string", "jsonPath": ".status.workers.readyText",
         "description": "Ready worker pods / desired."},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.total",
         "description": "Restarts of every layer."},
        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step",
         "description": "The newest training step."},
        {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.lastCheckpoint.step",
         "description": "The step of the newest complete checkpoint."},
        {"name": "Checkpointed", "type": "date", "jsonPath": ".status.lastCheckpoint.time",
         "description": "When the newest checkpoint was committed."},
        {"name": "Goodput", "type": "number", "jsonPath": ".status.progress.goodputPercent",
         "description": "Useful step time over wall time, in percent."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]  # fmt: skip


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of ResilientTrainingJob, generated from the models."""
    root = _model_schema(ResilientTrainingJob)
    root["description"] = (
        "ResilientTrainingJob runs a distributed PyTorch FSDP training job on one pod per node and keeps it "
        "making progress through faults: in-process restarts, in-job restarts, pod replacement and node "
        "exclusion."
    )
    root["properties"]["apiVersion"] = {
        "type": "string",
        "description": root["properties"]["apiVersion"]["description"],
    }
    root["properties"]["kind"] = {"type": "string", "description": root["properties"]["kind"]["description"]}
    root["required"] = ["spec"]
    # The API server forbids anything but name/generateName restrictions under metadata (even a
    # description): the root's metadata schema must be exactly {type: object[, properties.name]}.
    root["properties"]["metadata"].pop("description")
    schema = {"description": root.pop("description"), **root}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{constants.PLURAL}.{constants.GROUP}",
            "labels": {constants.LABEL_APP_NAME: "resilient-training-operator"},
        },
        "spec": {
            "group": constants.GROUP,
            "names": {
                "kind": constants.KIND,
                "listKind": f"{constants.KIND}List",
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": list(constants.SHORT_NAMES),
                "categories": list(constants.CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML document kept in crds/ (stable bytes: the key order is the models')."""
    header = "# Generated from rtj_operator.api by `rtj crd --write`; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120, allow_unicode=True)
