"""The spec models of ResilientTrainingJob: what a user writes, with defaults, bounds and cross-field rules.

Each field's description is the user's documentation (it becomes the CRD's ``description`` and
docs/api.md); it starts with the JSON name, gives the default and says optional or required. One
module per area of the spec (``resources``, ``scheduling``, ``rendezvous``, ``checkpoint``,
``fault_tolerance``, ``failure_policy``, ``disruption``, ``progress``, and what they share in
``common``); the spec itself, with its cross-field rules, is here.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from rtj_operator import constants
from rtj_operator.api.corev1 import (
    EnvVar,
    Image,
    LabelValue,
    MapKey,
    Volume,
    VolumeMount,
    keys_are_qualified_names,
)
from rtj_operator.api.schema import ApiModel, CelRule, Flag, Immutable, Int32, Int64
from rtj_operator.api.spec.checkpoint import (
    MAX_MEMORY_INTERVAL_STEPS,
    CheckpointMode,
    CheckpointSpec,
    DynamicStorage,
    ExistingClaimStorage,
    FileSystemId,
    FsxStaticStorage,
    MountName,
    RetentionPolicy,
    StorageSpec,
)
from rtj_operator.api.spec.common import (
    CHECKPOINT_VOLUME,
    DEFAULT_TERMINATION_GRACE_SECONDS,
    FT_LAUNCHER_CONFIG_MOUNT_PATH,
    FT_LAUNCHER_CONFIG_VOLUME,
    JOB_NAME_PATTERN,
    LIBRARY_ONLY_FIELDS,
    LIBRARY_ONLY_NOTE,
    MAX_JOB_NAME_LENGTH,
    MAX_PORT,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUMES,
    RUNTIME_MOUNT_PATH,
    RUNTIME_VOLUME,
    SCRATCH_VOLUME,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
    ZONE_LABEL,
    AnnotationValue,
    Arg,
    AvailabilityZone,
    ImagePullPolicy,
)
from rtj_operator.api.spec.disruption import DisruptionSpec, PodDisruptionBudgetSpec
from rtj_operator.api.spec.failure_policy import (
    MAX_BUDGET_RESTARTS,
    MAX_FAILURE_RULES,
    ExitCode,
    ExitCodeOperator,
    ExitCodeRequirement,
    FailureAction,
    FailurePolicy,
    FailureRule,
    FaultBudget,
    FaultClass,
    FaultReason,
)
from rtj_operator.api.spec.fault_tolerance import (
    FT_CONFIG_KEYS_SET_ELSEWHERE,
    FT_CONFIG_MAX_KEYS,
    FaultTolerance,
    FtLauncherConfig,
    FtLauncherConfigMap,
    FtLauncherSpec,
    InProcessRestart,
    Launcher,
)
from rtj_operator.api.spec.progress import (
    DEFAULT_STALL_AFTER_SECONDS,
    MAX_STALL_AFTER_SECONDS,
    MAX_STEP_LOG_PATTERN_LENGTH,
    ProgressSpec,
    StepLogPattern,
)
from rtj_operator.api.spec.rendezvous import RendezvousHost, RendezvousSpec, SpareMode
from rtj_operator.api.spec.resources import (
    KNOWN_INSTANCE_TYPES,
    HugePages2Mi,
    InstanceTypeName,
    ResourceOverrides,
)
from rtj_operator.api.spec.scheduling import (
    DEFAULT_COSCHEDULING_SCHEDULER,
    CoschedulingAdmission,
    GangScheduling,
    KueueAdmission,
    SchedulingSpec,
)

__all__ = [
    "CHECKPOINT_VOLUME",
    "DEFAULT_COSCHEDULING_SCHEDULER",
    "DEFAULT_STALL_AFTER_SECONDS",
    "DEFAULT_TERMINATION_GRACE_SECONDS",
    "FT_CONFIG_KEYS_SET_ELSEWHERE",
    "FT_CONFIG_MAX_KEYS",
    "FT_LAUNCHER_CONFIG_MOUNT_PATH",
    "FT_LAUNCHER_CONFIG_VOLUME",
    "JOB_NAME_PATTERN",
    "KNOWN_INSTANCE_TYPES",
    "LIBRARY_ONLY_FIELDS",
    "LIBRARY_ONLY_NOTE",
    "MAX_BUDGET_RESTARTS",
    "MAX_FAILURE_RULES",
    "MAX_JOB_NAME_LENGTH",
    "MAX_MEMORY_INTERVAL_STEPS",
    "MAX_PORT",
    "MAX_STALL_AFTER_SECONDS",
    "MAX_STEP_LOG_PATTERN_LENGTH",
    "RESERVED_MOUNT_PATHS",
    "RESERVED_VOLUMES",
    "RUNTIME_MOUNT_PATH",
    "RUNTIME_VOLUME",
    "SCRATCH_VOLUME",
    "SHM_MOUNT_PATH",
    "SHM_VOLUME",
    "ZONE_LABEL",
    "AnnotationValue",
    "Arg",
    "AvailabilityZone",
    "CheckpointMode",
    "CheckpointSpec",
    "CoschedulingAdmission",
    "DisruptionSpec",
    "DynamicStorage",
    "ExistingClaimStorage",
    "ExitCode",
    "ExitCodeOperator",
    "ExitCodeRequirement",
    "FailureAction",
    "FailurePolicy",
    "FailureRule",
    "FaultBudget",
    "FaultClass",
    "FaultReason",
    "FaultTolerance",
    "FileSystemId",
    "FsxStaticStorage",
    "FtLauncherConfig",
    "FtLauncherConfigMap",
    "FtLauncherSpec",
    "GangScheduling",
    "HugePages2Mi",
    "ImagePullPolicy",
    "InProcessRestart",
    "InstanceTypeName",
    "KueueAdmission",
    "Launcher",
    "MountName",
    "PodDisruptionBudgetSpec",
    "ProgressSpec",
    "RendezvousHost",
    "RendezvousSpec",
    "ResilientTrainingJobSpec",
    "ResourceOverrides",
    "RetentionPolicy",
    "SchedulingSpec",
    "SpareMode",
    "StepLogPattern",
    "StorageSpec",
    "has_store_pod",
    "library_only_fields_set",
    "spares_in_training",
]


def spares_in_training(spec: ResilientTrainingJobSpec) -> bool:
    """Whether the hot spares take part in the training (so a replacement never takes a spare's node):
    under Supervisor (reserve ranks) and under FtLauncher with rendezvous.spares Standby."""
    return spec.fault_tolerance.launcher is Launcher.SUPERVISOR or spec.rendezvous.spares is SpareMode.STANDBY


def has_store_pod(spec: ResilientTrainingJobSpec) -> bool:
    """Whether the job runs a store pod: always under Supervisor (the world's stores), and under
    FtLauncher when rendezvous.host is StorePod (the rendezvous' store)."""
    return (
        spec.fault_tolerance.launcher is Launcher.SUPERVISOR
        or spec.rendezvous.host is RendezvousHost.STORE_POD
    )


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


class ResilientTrainingJobSpec(ApiModel):
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
            rule=f"!has(self.volumes) || self.volumes.all(v, !(v.name in {list(RESERVED_VOLUMES)!r}))",
            message=f"volume names {', '.join(RESERVED_VOLUMES)} are reserved",
            check=lambda s: all(v.name not in RESERVED_VOLUMES for v in s.volumes),
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
                "m.mountPath != self.checkpoint.mountPath && "
                f"!(m.mountPath in {list(RESERVED_MOUNT_PATHS)!r}))"
            ),
            message=f"volumeMounts may not use checkpoint.mountPath, {' or '.join(RESERVED_MOUNT_PATHS)}",
            check=lambda s: all(
                m.mount_path != s.checkpoint.mount_path and m.mount_path not in RESERVED_MOUNT_PATHS
                for m in s.volume_mounts
            ),
            field_path=".volumeMounts",
        ),
        CelRule(
            rule=f"!has(self.podLabels) || self.podLabels.all(k, !k.startsWith('{constants.GROUP}/'))",
            message=f"podLabels may not use the reserved prefix {constants.GROUP}/",
            check=lambda s: not any(k.startswith(f"{constants.GROUP}/") for k in s.pod_labels),
            field_path=".podLabels",
        ),
        CelRule(
            rule=f"!(self.checkpoint.mountPath in {list(RESERVED_MOUNT_PATHS)!r})",
            message=f"checkpoint.mountPath may not be {' or '.join(RESERVED_MOUNT_PATHS)} (the shared-memory "
            "volume's, ft_launcher's config file's and the injected runtime's)",
            check=lambda s: s.checkpoint.mount_path not in RESERVED_MOUNT_PATHS,
            field_path=".checkpoint.mountPath",
        ),
        CelRule(
            rule="!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
            message="volume names must be unique",
            check=lambda s: len({v.name for v in s.volumes}) == len(s.volumes),
            field_path=".volumes",
        ),
        CelRule(
            rule=(
                "!has(self.volumeMounts) || "
                "self.volumeMounts.all(m, self.volumeMounts.exists_one(n, n.mountPath == m.mountPath))"
            ),
            message="volumeMounts mount paths must be unique",
            check=lambda s: len({m.mount_path for m in s.volume_mounts}) == len(s.volume_mounts),
            field_path=".volumeMounts",
        ),
        CelRule(
            rule=(
                f"!has(self.faultTolerance) || self.faultTolerance.launcher != '{Launcher.SUPERVISOR.value}' "
                f"|| !has(self.rendezvous) || self.rendezvous.port < {MAX_PORT}"
            ),
            message="rendezvous.port must be at most 65534 under faultTolerance.launcher Supervisor (the "
            "store pod also serves port + 1)",
            check=lambda s: (
                s.fault_tolerance.launcher is not Launcher.SUPERVISOR or s.rendezvous.port < MAX_PORT
            ),
            field_path=".rendezvous.port",
        ),
        CelRule(
            rule=(
                f"!has(self.rendezvous) || self.rendezvous.spares != '{SpareMode.STANDBY.value}' || "
                f"(self.rendezvous.host == '{RendezvousHost.STORE_POD.value}' && (!has(self.faultTolerance) "
                f"|| self.faultTolerance.launcher != '{Launcher.SUPERVISOR.value}'))"
            ),
            message="rendezvous.spares Standby needs faultTolerance.launcher FtLauncher and rendezvous.host "
            "StorePod (the standby nodes wait in the store pod's rendezvous)",
            check=lambda s: (
                s.rendezvous.spares is not SpareMode.STANDBY
                or (
                    s.rendezvous.host is RendezvousHost.STORE_POD
                    and s.fault_tolerance.launcher is not Launcher.SUPERVISOR
                )
            ),
            field_path=".rendezvous.spares",
        ),
        keys_are_qualified_names("podLabels", "pod_labels"),
        keys_are_qualified_names("podAnnotations", "pod_annotations"),
        _immutable_when_set("processesPerNode"),
    )

    image: Image = Field(description="image is the trainer image (printable ASCII, no whitespace). Required.")
    image_pull_policy: ImagePullPolicy = Field(
        default=ImagePullPolicy.IF_NOT_PRESENT,
        description="imagePullPolicy is Always, IfNotPresent or Never. Optional; default: IfNotPresent.",
    )
    runtime_image: Image | None = Field(
        default=None,
        description="runtimeImage is an image that holds this project's pod runtime (rtj-launch, the "
        "rtj_trainer package): when set, an init container copies the runtime from it into the pod "
        f"({RUNTIME_MOUNT_PATH}) and the worker runs it with image's own python3, so image needs only "
        "Python 3.11 or newer, torch and NVRx (docs/byo.md). Optional; default: image holds the runtime.",
    )
    command: list[Arg] = Field(
        default_factory=lambda: ["rtj-train"],
        min_length=1,
        max_length=64,
        description="command is the training program each rank runs (ft_launcher runs it with "
        '--no-python; rtj-launch under Supervisor). Optional; default: ["rtj-train"].',
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
        description=(
            "hotSpares is the number of warm spare pods, each holding a node sized like a worker's. Under "
            "faultTolerance.launcher FtLauncher they stay outside the rendezvous and a lost worker's "
            "replacement takes a spare's node (no scheduling, no image pull). Under Supervisor each runs "
            "processesPerNode reserve ranks inside the training world (torch loaded, waiting): a lost "
            "rank is taken over in-process by a reserve rank, and a lost pod's replacement then stands by "
            "on a new node. Optional; default: 0."
        ),
    )
    instance_type: Annotated[InstanceTypeName, Immutable()] = Field(
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
        description="scheduling adds node selection, tolerations, a priority class, co-location and gang "
        "admission. Optional.",
    )
    disruption: DisruptionSpec = Field(
        default_factory=DisruptionSpec,
        description="disruption configures the do-not-disrupt annotation, a PodDisruptionBudget, "
        "moving on notice and surge pods. Optional.",
    )
    rendezvous: Annotated[RendezvousSpec, Immutable()] = Field(
        default_factory=RendezvousSpec,
        description="rendezvous configures the c10d rendezvous (FtLauncher: its port and host) and "
        "the store pod's ports. Optional. Immutable.",
    )
    checkpoint: CheckpointSpec = Field(
        description="checkpoint configures checkpoint storage and cadence. Required."
    )
    fault_tolerance: FaultTolerance = Field(
        default_factory=FaultTolerance,
        description="faultTolerance chooses the launcher and configures heartbeats, in-job restarts and "
        "in-process restarts. Optional.",
    )
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy,
        description="failurePolicy configures pod replacement, node exclusion and budgets. Optional.",
    )
    progress: ProgressSpec = Field(
        default_factory=ProgressSpec,
        description="progress configures how the training progress is judged (stall detection). Optional.",
    )
    suspend: Flag = Field(
        default=False,
        description="suspend deletes the job's pods while true and recreates them when false. "
        "Optional; default: false.",
    )
    ttl_seconds_after_finished: Int32 | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="ttlSecondsAfterFinished deletes the job this long after it succeeded or failed. "
        "Optional; default: never.",
    )
    termination_grace_period_seconds: Int64 = Field(
        default=DEFAULT_TERMINATION_GRACE_SECONDS,
        ge=0,
        le=3600,
        description="terminationGracePeriodSeconds is the pods' grace period on deletion: on SIGTERM the "
        "workers finish the step in progress and the next one (by then every rank knows of the drain) and "
        "commit a checkpoint of it within this time (a drain), then exit. "
        f"Optional; default: {DEFAULT_TERMINATION_GRACE_SECONDS}.",
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
    pod_labels: dict[MapKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="podLabels are added to every pod; keys are qualified names (those under "
        f"{constants.GROUP}/ are reserved), values label values. Optional; default: empty.",
    )
    pod_annotations: dict[MapKey, AnnotationValue] = Field(
        default_factory=dict,
        max_length=32,
        description="podAnnotations are added to every pod; keys are qualified names. "
        "Optional; default: empty.",
    )


def library_only_fields_set(spec: ResilientTrainingJobSpec) -> tuple[str, ...]:
    """The LIBRARY_ONLY_FIELDS that ``spec`` sets to a value other than the field's default, in order."""
    return tuple(path for path in LIBRARY_ONLY_FIELDS if _differs_from_default(spec, path))


def _differs_from_default(spec: ResilientTrainingJobSpec, path: str) -> bool:
    *parents, leaf = path.split(".")
    model: BaseModel = spec
    for key in parents:
        model = getattr(model, _attribute(type(model), key))
    attr = _attribute(type(model), leaf)
    default = type(model).model_fields[attr].get_default(call_default_factory=True)
    return bool(getattr(model, attr) != default)


def _attribute(model: type[BaseModel], key: str) -> str:
    """The Python attribute of the field whose JSON name is ``key``."""
    return next(attr for attr, info in model.model_fields.items() if (info.alias or attr) == key)
