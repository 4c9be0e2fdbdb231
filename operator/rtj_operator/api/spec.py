"""The spec models of ResilientTrainingJob: what a user writes, with defaults, bounds and cross-field rules.

Each field's description is the user's documentation (it becomes the CRD's ``description`` and
docs/api.md); it starts with the JSON name, gives the default and says optional or required.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, Strict
from rtj_contract import env as env_names
from rtj_contract import termination

from rtj_operator import constants
from rtj_operator.api.corev1 import (
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_LONG_PREFIX,
    AbsolutePath,
    ConfigKey,
    DnsLabel,
    EnvVar,
    Image,
    LabelValue,
    MapKey,
    Name,
    NodeSelectorTerm,
    OptionalName,
    PositiveQuantity,
    QualifiedName,
    Toleration,
    Volume,
    VolumeMount,
    cel_string,
    keys_are_qualified_names,
    matches,
)
from rtj_operator.api.schema import ApiModel, CelRule, Flag, Immutable, Int32, Int64, SchemaExtra

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
SCRATCH_VOLUME: str = "rtj-scratch"
FT_LAUNCHER_CONFIG_VOLUME: str = "rtj-ft-launcher"
# The pod runtime copied from spec.runtimeImage (rtj_trainer.runtime.install), an emptyDir.
RUNTIME_VOLUME: str = "rtj-runtime"
RESERVED_VOLUMES: tuple[str, ...] = (
    CHECKPOINT_VOLUME,
    SHM_VOLUME,
    SCRATCH_VOLUME,
    FT_LAUNCHER_CONFIG_VOLUME,
    RUNTIME_VOLUME,
)
SHM_MOUNT_PATH: str = "/dev/shm"
# Where the ConfigMap of faultTolerance.ftLauncher.configMap is mounted, read-only (RTJ_FT_CONFIG_FILE is
# this directory and the ConfigMap's key); reserved whether or not a job uses it.
FT_LAUNCHER_CONFIG_MOUNT_PATH: str = "/etc/rtj/ft-launcher"
# Where the runtime of spec.runtimeImage lies, read-only in the worker; reserved whether or not a job uses it.
RUNTIME_MOUNT_PATH: str = "/opt/rtj/runtime"
RESERVED_MOUNT_PATHS: tuple[str, ...] = (SHM_MOUNT_PATH, FT_LAUNCHER_CONFIG_MOUNT_PATH, RUNTIME_MOUNT_PATH)

# The fields that only the project's training library (rtj_trainer, which rtj-train uses) honours, as
# JSON paths under spec: a training script of one's own ignores them. Each one's description ends with
# LIBRARY_ONLY_NOTE; the operator reports those a job sets to other than their default while its workers
# report no library (library_only_fields_set). inProcess.enabled is library-only too, but not listed: a
# script of one's own is told to set it false, which must not read as a setting it ignores.
LIBRARY_ONLY_FIELDS: tuple[str, ...] = (
    "checkpoint.intervalSteps",
    "checkpoint.keep",
    "checkpoint.mode",
    "checkpoint.memoryIntervalSteps",
    "faultTolerance.inProcess.maxIterations",
    "faultTolerance.inProcess.softTimeoutSeconds",
    "faultTolerance.inProcess.hardTimeoutSeconds",
    "faultTolerance.inProcess.barrierTimeoutSeconds",
)
LIBRARY_ONLY_NOTE: str = (
    "Applies to training scripts that use the rtj library (rtj-train does); a script of your own ignores it."
)

# A job's name becomes its Service name (a DNS-1035 label) and the prefix of its pods' hostnames
# `<name>-worker-<i>` (DNS labels, at most 63 characters, with i < 1024): hence 50 characters.
MAX_JOB_NAME_LENGTH: int = 50
JOB_NAME_PATTERN: str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

AnnotationValue = Annotated[str, Strict(), Field(max_length=4096)]
Arg = Annotated[str, Strict(), Field(max_length=4096)]
InstanceTypeName = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)]
# Kubernetes refuses a hugepages quantity that is not a whole number of pages (2Mi): written in Mi, Gi or Ti.
HugePages2Mi = Annotated[
    str, Strict(), Field(max_length=32, pattern=r"^(0+(\.0*)?([KMGT]i)?|[0-9]*[02468]Mi|[0-9]+(Gi|Ti))$")
]
FileSystemId = Annotated[str, Strict(), Field(max_length=32, pattern=r"^fs-[0-9a-f]{8,17}$")]
MountName = Annotated[str, Strict(), Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_]+$")]
# An AWS availability zone name (us-east-1a, us-gov-west-1b, use1-az1 is a zone id, not a name).
AvailabilityZone = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)]
ZONE_LABEL: str = constants.LABEL_ZONE
# Time for a drain: finish the step, write this node's shards to the volume, wait for the commit.
DEFAULT_TERMINATION_GRACE_SECONDS: int = 180
DEFAULT_COSCHEDULING_SCHEDULER: str = "scheduler-plugins-scheduler"
MAX_MEMORY_INTERVAL_STEPS: int = 1_000_000
MAX_PORT: int = 65535


class ImagePullPolicy(enum.StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class CheckpointMode(enum.StrEnum):
    # Async: shards are copied to a staging buffer and written by a background process.
    ASYNC = "Async"
    # Sync: training waits while every shard is written.
    SYNC = "Sync"


class Launcher(enum.StrEnum):
    # FtLauncher: NVRx's ft_launcher runs each pod's ranks; a torchelastic rendezvous hosted by worker 0.
    FT_LAUNCHER = "FtLauncher"
    # Supervisor: rtj-launch runs each pod's ranks in one fixed NVRx in-process world, spares included;
    # the world's stores live in a store pod of their own.
    SUPERVISOR = "Supervisor"


class RendezvousHost(enum.StrEnum):
    # Worker0: worker 0's ft_launcher hosts the c10d store; losing worker 0's node restarts every pod.
    WORKER0 = "Worker0"
    # StorePod: a small store pod of the job's own hosts it; losing any worker's node is one replacement.
    STORE_POD = "StorePod"


class SpareMode(enum.StrEnum):
    # HoldNode: a hot spare holds a node outside the rendezvous; a lost worker's replacement takes it.
    HOLD_NODE = "HoldNode"
    # Standby: a hot spare's ft_launcher waits in the rendezvous as a standby node (NVRx 0.7 or later)
    # and takes a lost node's place in the next round; the lost worker's replacement stands by in turn.
    STANDBY = "Standby"


class RetentionPolicy(enum.StrEnum):
    # Retain: the checkpoint claim outlives the job (it carries no owner reference).
    RETAIN = "Retain"
    # Delete: the claim is owned by the job and garbage-collected with it.
    DELETE = "Delete"


class ResourceOverrides(ApiModel):
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
    cpu: PositiveQuantity | None = Field(
        default=None,
        description="cpu is the CPU request per pod (a positive quantity). Optional; default: the profile's.",
    )
    memory: PositiveQuantity | None = Field(
        default=None,
        description="memory is the memory request and limit per pod (a positive quantity). "
        "Optional; default: the profile's.",
    )
    hugepages2_mi: HugePages2Mi | None = Field(
        default=None,
        alias="hugepages2Mi",
        description=(
            "hugepages2Mi is the hugepages-2Mi request and limit per pod, a whole number of 2Mi pages: "
            'an even number of Mi or a whole number of Gi or Ti ("0" for none). '
            "Optional; default: the profile's."
        ),
    )
    shm_size: PositiveQuantity | None = Field(
        default=None,
        description=(
            "shmSize is the size limit of the memory-backed /dev/shm volume (a positive quantity). "
            "Optional; default: the profile's."
        ),
    )


class KueueAdmission(ApiModel):
    """Admission through Kueue's plain-pod integration, the pods forming one Kueue pod group."""

    queue_name: DnsLabel = Field(
        description="queueName is the Kueue LocalQueue in the job's namespace (the pods' "
        "kueue.x-k8s.io/queue-name label). Required."
    )


class CoschedulingAdmission(ApiModel):
    """A scheduler-plugins coscheduling PodGroup (scheduling.x-k8s.io/v1alpha1), owned by the job."""

    scheduler_name: DnsLabel = Field(
        default=DEFAULT_COSCHEDULING_SCHEDULER,
        description="schedulerName is the scheduler that runs the coscheduling plugin (the pods' "
        f"schedulerName). Optional; default: {DEFAULT_COSCHEDULING_SCHEDULER}.",
    )
    schedule_timeout_seconds: Int32 = Field(
        default=600,
        ge=1,
        le=86400,
        description="scheduleTimeoutSeconds is how long the group's pods wait for all of them to fit "
        "before the plugin rejects the group (it retries later). Optional; default: 600.",
    )


class GangScheduling(ApiModel):
    """All-or-nothing admission of the job's pods: exactly one of the options."""

    cel_rules = (
        CelRule(
            rule="has(self.kueue) != has(self.coscheduling)",
            message="exactly one of kueue, coscheduling must be set",
            check=lambda s: (s.kueue is None) != (s.coscheduling is None),
        ),
    )

    kueue: KueueAdmission | None = Field(
        default=None,
        description="kueue queues the pods as one Kueue pod group (kueue.x-k8s.io/pod-group-name, "
        "kueue.x-k8s.io/pod-group-total-count: workers plus spares). Optional; one of two.",
    )
    coscheduling: CoschedulingAdmission | None = Field(
        default=None,
        description="coscheduling creates a PodGroup with minMember = nodes and labels the pods "
        "scheduling.x-k8s.io/pod-group. Optional; one of two.",
    )


class SchedulingSpec(ApiModel):
    """Where the job's pods may run, in addition to the instance-type affinity the operator renders."""

    cel_rules = (
        keys_are_qualified_names("nodeSelector", "node_selector"),
        CelRule(
            rule=(
                "!has(self.sameTopology) || "
                f"self.sameTopology.all(k, !k.matches({cel_string(QUALIFIED_NAME_LONG_PREFIX)}))"
            ),
            message="every key of sameTopology must be a qualified name (its prefix at most 253 characters)",
            check=lambda s: not any(matches(QUALIFIED_NAME_LONG_PREFIX, k) for k in s.same_topology),
            field_path=".sameTopology",
        ),
    )

    node_selector: dict[MapKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="nodeSelector is added to every pod's nodeSelector; keys are qualified names, values "
        "label values. Optional; default: empty.",
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
        default=None, description="priorityClassName is the pods' PriorityClass (a DNS subdomain). Optional."
    )
    same_topology: list[QualifiedName] = Field(
        default_factory=lambda: [ZONE_LABEL],
        max_length=4,
        description=(
            "sameTopology lists node label keys whose value all of the job's pods share (required pod "
            "affinity among the job's pods, one term per key): the scheduler places the first pod, the "
            f"others follow. Default: [{ZONE_LABEL}], since EFA and an FSx for Lustre file system do "
            "not cross availability zones; add a node-group or placement-group label to keep EFA "
            "traffic within one; [] for none. Optional."
        ),
    )
    gang: GangScheduling | None = Field(
        default=None,
        description="gang admits the job's pods all together or not at all: through Kueue or the "
        "scheduler-plugins coscheduling plugin. Optional; default: none.",
    )


class RendezvousSpec(ApiModel):
    """Where ft_launcher's c10d rendezvous lives (FtLauncher), and the ports of the store pod."""

    port: Int32 = Field(
        default=29500,
        ge=1,
        le=65535,
        description="port is the rendezvous (c10d store) port, on worker 0 or on the store pod (see "
        "host) under faultTolerance.launcher FtLauncher; under Supervisor the store pod serves the "
        "world's store on it and the process groups' store on port + 1 (so at most 65534). Optional; "
        "default: 29500.",
    )
    host: RendezvousHost = Field(
        default=RendezvousHost.WORKER0,
        description="host is what hosts the rendezvous under faultTolerance.launcher FtLauncher. "
        "Worker0: worker 0's ft_launcher, so losing worker 0's node restarts every pod (a gang "
        "restart). StorePod: a store pod of the job's own (<name>-store: 100m CPU, 256Mi, on a node "
        "without the job's pods, such as a system node), so losing any worker's node, worker 0's "
        "included, is one pod replacement; losing the store pod restarts every pod. The store pod runs "
        "a plain c10d store on NVRx 0.4 and NVRx's nvrx-control from 0.7 (the barrier rendezvous needs a "
        "host that closes its rounds); a release with the barrier rendezvous but no nvrx-control cannot "
        "host it there. Supervisor always has a store pod. Optional; default: Worker0.",
    )
    spares: SpareMode = Field(
        default=SpareMode.HOLD_NODE,
        description="spares is how hotSpares take part under faultTolerance.launcher FtLauncher. "
        "HoldNode: each holds a node outside the rendezvous, and a lost worker's replacement pod is "
        "created on a spare's node (no scheduling, no image pull; the training restarts once it has "
        "started). Standby (NVRx 0.7 or later, with host StorePod): each spare's ft_launcher joins the "
        "rendezvous as a standby node (--nnodes=nodes:nodes+hotSpares) and takes a lost node's place in "
        "the next round, without waiting for a pod; the lost worker's replacement, created wherever it "
        "fits, stands by in turn. On an older NVRx a Standby job fails at its first start, naming this "
        "field. Supervisor's spares always run reserve ranks. Optional; default: HoldNode.",
    )


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


class InProcessRestart(ApiModel):
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
        default=True,
        description="enabled turns in-process restarts on; a script of your own sets false (only the rtj "
        "library restarts in-process). Optional; default: true.",
    )
    max_iterations: Int32 = Field(
        default=10,
        ge=1,
        le=1000,
        description="maxIterations is the number of in-process restarts before giving up to the launcher. "
        f"Optional; default: 10. {LIBRARY_ONLY_NOTE}",
    )
    soft_timeout_seconds: Int32 = Field(
        default=60,
        ge=1,
        le=86400,
        description="softTimeoutSeconds is how long a rank may make no progress before it is interrupted. "
        f"Optional; default: 60. {LIBRARY_ONLY_NOTE}",
    )
    hard_timeout_seconds: Int32 = Field(
        default=90,
        ge=1,
        le=86400,
        description="hardTimeoutSeconds is how long a rank may make no progress before it is terminated; "
        f"greater than softTimeoutSeconds. Optional; default: 90. {LIBRARY_ONLY_NOTE}",
    )
    barrier_timeout_seconds: Int32 = Field(
        default=120,
        ge=1,
        le=86400,
        description="barrierTimeoutSeconds bounds the restart barrier among ranks. Optional; default: 120. "
        f"{LIBRARY_ONLY_NOTE}",
    )


# Keys of ft_launcher's fault_tolerance section that ftLauncher.config may not set, and why: rtj-launch
# passes the first two as ft_launcher flags from spec fields (a flag wins over the file); the next two are
# torchelastic flags, not settings of the section (which would ignore them); rtj-launch sets the NIC
# monitor itself (rtj_trainer.library.nvrx_compat.ft_launcher_tuning); and the map is the section itself.
FT_CONFIG_KEYS_SET_ELSEWHERE: Mapping[str, str] = {
    "initial_rank_heartbeat_timeout": (
        "set spec.faultTolerance.initialHeartbeatTimeoutSeconds instead (0: off)"
    ),
    "rank_heartbeat_timeout": "set spec.faultTolerance.heartbeatTimeoutSeconds instead (0: off)",
    "monitor_interval": "set spec.faultTolerance.monitorIntervalSeconds instead",
    "max_restarts": "set spec.faultTolerance.maxInJobRestarts instead",
    "enable_nic_monitor": "rtj-launch sets it (on for nodes with GPUs, off for CPU nodes)",
    "fault_tolerance": "config is the fault_tolerance section itself: write its keys directly",
}
FT_CONFIG_MAX_KEYS: int = 64


def _check_ft_config_keys(config: dict[str, Any]) -> dict[str, Any]:
    """Refuse the keys of FT_CONFIG_KEYS_SET_ELSEWHERE (CEL cannot see into a map of unknown fields)."""
    refused = [f"{key}: {why}" for key, why in FT_CONFIG_KEYS_SET_ELSEWHERE.items() if key in config]
    if refused:
        raise ValueError(f"config may not set {'; '.join(refused)}")
    return config


# A map of unknown fields: the API server keeps it as written, the operator checks its keys.
FtLauncherConfig = Annotated[
    dict[str, Any],
    Field(max_length=FT_CONFIG_MAX_KEYS),
    SchemaExtra({"x-kubernetes-preserve-unknown-fields": True}),
    AfterValidator(_check_ft_config_keys),
]


class FtLauncherConfigMap(ApiModel):
    """A key of a ConfigMap that holds ft_launcher's config file, mounted read-only into the pods."""

    name: Name = Field(
        description="name is the ConfigMap's name, in the job's namespace; a pod waits in ContainerCreating "
        "until the ConfigMap and its key exist. Required."
    )
    key: ConfigKey = Field(
        default="config.yaml",
        description=(
            "key is the ConfigMap's key whose value is the file: YAML with a fault_tolerance section "
            "(at the top level or nested), as ft_launcher's --ft-cfg-path reads it. It is mounted at "
            f"{FT_LAUNCHER_CONFIG_MOUNT_PATH}/<key> ({env_names.FT_CONFIG_FILE}). "
            "Optional; default: config.yaml."
        ),
    )


class FtLauncherSpec(ApiModel):
    """ft_launcher's settings beyond the spec's own: NVRx's FaultToleranceConfig, inline or in a ConfigMap."""

    cel_rules = (
        CelRule(
            rule="has(self.config) != has(self.configMap)",
            message="exactly one of config, configMap must be set",
            check=lambda s: (s.config is None) != (s.config_map is None),
        ),
    )

    config: FtLauncherConfig | None = Field(
        default=None,
        description=(
            "config is the fault_tolerance section of ft_launcher's config file, as a map of NVRx's "
            "FaultToleranceConfig settings: for example rank_section_timeouts (a map of section name to "
            "seconds) and rank_out_of_section_timeout for a script that uses NVRx's sections API, "
            "workload_check_interval, safety_factor, rank_termination_signal, log_level (a script that "
            "only times sections also sets heartbeatTimeoutSeconds and initialHeartbeatTimeoutSeconds to "
            "0). "
            "rtj-launch writes it to a file as `fault_tolerance: <config>` "
            f"({env_names.FT_CONFIG}) and passes it to ft_launcher; settings the image's NVRx "
            "release does not know are ignored. The API server keeps "
            "the map as written; the operator refuses a job (Ready=False, reason InvalidSpec) whose map "
            f"sets one of {', '.join(FT_CONFIG_KEYS_SET_ELSEWHERE)}, saying what sets it instead (the "
            "spec's fields or rtj-launch; ft_launcher's flags win over its file), and so does `rtj render`. "
            f"Optional; one of config, configMap; at most {FT_CONFIG_MAX_KEYS} entries."
        ),
    )
    config_map: FtLauncherConfigMap | None = Field(
        default=None,
        description=(
            "configMap names a ConfigMap key holding the whole config file, mounted read-only at "
            f"{FT_LAUNCHER_CONFIG_MOUNT_PATH}/ in the worker and spare containers "
            f"({env_names.FT_CONFIG_FILE}); the operator does not read it. A file that sets "
            "initial_rank_heartbeat_timeout or rank_heartbeat_timeout keeps its values (rtj-launch then "
            "passes no heartbeat flag). Optional; one of config, configMap."
        ),
    )


class FaultTolerance(ApiModel):
    """Who runs the ranks (the launcher), ft_launcher heartbeats and restarts, and in-process restarts."""

    cel_rules = (
        CelRule(
            rule=(
                f"self.launcher != '{Launcher.SUPERVISOR.value}' || "
                "!has(self.inProcess) || self.inProcess.enabled"
            ),
            message=(
                "launcher Supervisor requires inProcess.enabled: true (reserve ranks take over lost ranks "
                "through in-process restarts)"
            ),
            check=lambda s: s.launcher is not Launcher.SUPERVISOR or s.in_process.enabled,
            field_path=".launcher",
        ),
        CelRule(
            rule="(self.heartbeatTimeoutSeconds == 0) == (self.initialHeartbeatTimeoutSeconds == 0)",
            message=(
                "heartbeatTimeoutSeconds and initialHeartbeatTimeoutSeconds are 0 together (heartbeat "
                "timeouts off) or neither"
            ),
            check=lambda s: (s.heartbeat_timeout_seconds == 0) == (s.initial_heartbeat_timeout_seconds == 0),
            field_path=".heartbeatTimeoutSeconds",
        ),
        CelRule(
            rule="self.initialHeartbeatTimeoutSeconds >= self.heartbeatTimeoutSeconds",
            message="initialHeartbeatTimeoutSeconds must be at least heartbeatTimeoutSeconds",
            check=lambda s: s.initial_heartbeat_timeout_seconds >= s.heartbeat_timeout_seconds,
            field_path=".initialHeartbeatTimeoutSeconds",
        ),
        CelRule(
            rule=(
                "self.heartbeatTimeoutSeconds == 0 || "
                "self.monitorIntervalSeconds < self.heartbeatTimeoutSeconds"
            ),
            message="monitorIntervalSeconds must be less than heartbeatTimeoutSeconds",
            check=lambda s: (
                s.heartbeat_timeout_seconds == 0 or s.monitor_interval_seconds < s.heartbeat_timeout_seconds
            ),
            field_path=".monitorIntervalSeconds",
        ),
        CelRule(
            rule=(
                "!has(self.inProcess) || !self.inProcess.enabled || "
                "self.heartbeatTimeoutSeconds > self.inProcess.hardTimeoutSeconds"
            ),
            message=(
                "heartbeatTimeoutSeconds must be greater than inProcess.hardTimeoutSeconds while in-process "
                "restarts are enabled (an in-process restart must finish before the launcher declares a "
                "hang; a script of your own, which does not restart in-process, sets "
                "inProcess.enabled: false)"
            ),
            check=lambda s: (
                (not s.in_process.enabled) or s.heartbeat_timeout_seconds > s.in_process.hard_timeout_seconds
            ),
            field_path=".heartbeatTimeoutSeconds",
        ),
        CelRule(
            rule=f"self.launcher != '{Launcher.SUPERVISOR.value}' || !has(self.ftLauncher)",
            message="ftLauncher applies to launcher FtLauncher only",
            check=lambda s: s.launcher is not Launcher.SUPERVISOR or s.ft_launcher is None,
            field_path=".ftLauncher",
        ),
    )

    launcher: Annotated[Launcher, Immutable()] = Field(
        default=Launcher.FT_LAUNCHER,
        description=(
            "launcher is what runs each pod's training processes. FtLauncher: NVRx's ft_launcher in every "
            "worker pod, with a rendezvous hosted by worker 0 or by a store pod (rendezvous.host); a rank "
            "that dies or hangs restarts the processes of every pod (an in-job restart, ~10 s plus the "
            "reload of the last checkpoint), and the loss of worker 0's node restarts every pod unless the "
            "store pod hosts the rendezvous. Supervisor: rtj-launch starts the ranks "
            "itself in one fixed NVRx in-process world (no ft_launcher, no rendezvous) that the hot "
            "spares' pods join as reserve ranks; a rank that dies or hangs, or a node that is lost (worker "
            "0's included), is replaced in-process by a reserve rank that takes over its index and its "
            "state from the memory tier (checkpoint.memoryIntervalSteps), in seconds and without a pod "
            "restart; the world's stores live in a small store pod of their own (<name>-store: 100m CPU, "
            "256Mi, on a node without the job's pods), whose loss restarts every pod. Supervisor needs "
            "inProcess.enabled and spends each spare's GPUs on idle reserve ranks, and a job recovers "
            "in-process from as many rank or node losses as there are spares' ranks; the "
            "heartbeat and in-job restart fields apply to FtLauncher only. Optional; default: FtLauncher. "
            "Immutable."
        ),
    )
    heartbeat_timeout_seconds: Int32 = Field(
        default=300,
        ge=0,
        le=86400,
        description="heartbeatTimeoutSeconds is how long a rank may miss heartbeats before ft_launcher "
        "restarts the workers; 0 (with initialHeartbeatTimeoutSeconds 0) turns heartbeat timeouts off, as "
        "a script that times NVRx sections and sends no heartbeats needs (its section timeouts go in "
        "ftLauncher.config). Optional; default: 300.",
    )
    initial_heartbeat_timeout_seconds: Int32 = Field(
        default=600,
        ge=0,
        le=86400,
        description="initialHeartbeatTimeoutSeconds is the heartbeat timeout before a rank's first "
        "heartbeat; at least heartbeatTimeoutSeconds; 0 only with heartbeatTimeoutSeconds 0 (off). "
        "Optional; default: 600.",
    )
    monitor_interval_seconds: Int32 = Field(
        default=5,
        ge=1,
        le=86400,
        description="monitorIntervalSeconds is how often ft_launcher checks its workers; less than "
        "heartbeatTimeoutSeconds. Optional; default: 5.",
    )
    max_in_job_restarts: Int32 = Field(
        default=20,
        ge=0,
        le=10000,
        description="maxInJobRestarts is the number of worker-process restarts ft_launcher makes before the "
        "pod fails. Optional; default: 20.",
    )
    in_process: InProcessRestart = Field(
        default_factory=InProcessRestart,
        description=(
            "inProcess configures NVRx in-process restarts. A script of your own sets enabled: false (it "
            "restarts through ft_launcher only, and heartbeatTimeoutSeconds need then not exceed "
            "inProcess.hardTimeoutSeconds); rtj-train, the default command, restarts in-process. "
            f"Optional; default: enabled. {LIBRARY_ONLY_NOTE}"
        ),
    )
    ft_launcher: FtLauncherSpec | None = Field(
        default=None,
        description=(
            "ftLauncher configures ft_launcher beyond the fields above, with NVRx's own settings: inline "
            "(config) or from a ConfigMap (configMap). The fields above still apply: rtj-launch passes "
            "them to ft_launcher as flags, which win over the file. Applies to launcher FtLauncher only. "
            "Optional; default: none (ft_launcher's defaults)."
        ),
    )


class FaultClass(enum.StrEnum):
    # NodeLoss: the worker's node is lost (NotReady or unreachable beyond nodeLossGraceSeconds, deleted,
    # or tainted NoExecute without a toleration).
    NODE_LOSS = "NodeLoss"
    # ProcessFailure: the worker pod failed on a healthy node (its ft_launcher gave up).
    PROCESS_FAILURE = "ProcessFailure"
    # Disruption: the worker pod was evicted, preempted, drained or deleted by someone else.
    DISRUPTION = "Disruption"


class FailureAction(enum.StrEnum):
    # FailJob: the job is Failed at once; nothing is replaced.
    FAIL_JOB = "FailJob"
    # RestartJob: every worker pod is recreated (a gang restart).
    RESTART_JOB = "RestartJob"
    # ReplaceWorker: only the lost worker's pod is recreated (a gang restart when it is worker 0, the
    # rendezvous host).
    REPLACE_WORKER = "ReplaceWorker"
    # Ignore: recovered as the fault class would be by default, counted against no budget or backoff.
    IGNORE = "Ignore"


class ExitCodeOperator(enum.StrEnum):
    # In: the exit code is one of values.
    IN = "In"
    # NotIn: the exit code is none of values.
    NOT_IN = "NotIn"


# A fault or disruption reason: one CamelCase word, as Kubernetes condition and event reasons are.
FaultReason = Annotated[
    str,
    Strict(),
    Field(
        min_length=1,
        max_length=termination.FAULT_REASON_MAX_CHARS,
        pattern=rf"^{termination.FAULT_REASON_NAME}$",
    ),
]
ExitCode = Annotated[Int32, Field(ge=1, le=255)]
MAX_FAILURE_RULES: int = 16
MAX_BUDGET_RESTARTS: int = 100


class ExitCodeRequirement(ApiModel):
    """Which non-zero exit codes of the worker container a rule matches."""

    operator: ExitCodeOperator = Field(
        description="operator is In (the exit code is one of values) or NotIn (none of values). Required."
    )
    values: list[ExitCode] = Field(
        min_length=1,
        max_length=255,
        description="values are exit codes from 1 to 255 (a process killed by signal N exits 128+N). "
        "Required; at least one.",
    )


class FailureRule(ApiModel):
    """One rule of the failure policy: what a fault matches, and what is done about it.

    Rules are tried in order; the first that matches a worker's fault decides. A fault no rule matches
    gets its class's default: RestartJob for ProcessFailure, ReplaceWorker for NodeLoss and Disruption.
    """

    cel_rules = (
        CelRule(
            rule=(
                "[has(self.onExitCodes), has(self.onFaultReasons), has(self.onDisruptionReasons)]"
                ".filter(x, x).size() == 1"
            ),
            message="exactly one of onExitCodes, onFaultReasons, onDisruptionReasons must be set",
            check=lambda r: [r.on_exit_codes, r.on_fault_reasons, r.on_disruption_reasons].count(None) == 2,
        ),
    )

    action: FailureAction = Field(
        description="action is FailJob, RestartJob, ReplaceWorker or Ignore (replace as the class's "
        "default would, counted against no budget). Required."
    )
    on_exit_codes: ExitCodeRequirement | None = Field(
        default=None,
        description="onExitCodes matches a ProcessFailure by the worker container's exit code. "
        "Optional; one of onExitCodes, onFaultReasons, onDisruptionReasons.",
    )
    on_fault_reasons: list[FaultReason] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "onFaultReasons matches a ProcessFailure by its fault reason: the trainer's, from a line "
            "'FaultReason: <Reason>' of the container's termination message, else the container's "
            "termination reason (OOMKilled, Error, ContainerCannotRun...). "
            "Optional; one of onExitCodes, onFaultReasons, onDisruptionReasons."
        ),
    )
    on_disruption_reasons: list[FaultReason] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "onDisruptionReasons matches a Disruption by the pod's DisruptionTarget condition reason "
            "(PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager, TerminationByKubelet, "
            "DeletionByPodGC) or its status reason (Evicted, Preempting, Shutdown, Terminated). "
            "Optional; one of onExitCodes, onFaultReasons, onDisruptionReasons."
        ),
    )


class FaultBudget(ApiModel):
    """A budget of one fault class: at most maxRestarts counted faults within windowSeconds."""

    fault_class: FaultClass = Field(
        description="faultClass is NodeLoss, ProcessFailure or Disruption. Required."
    )
    max_restarts: Int32 = Field(
        ge=0,
        le=MAX_BUDGET_RESTARTS,
        description=f"maxRestarts is the number of faults of the class the job recovers from within "
        f"windowSeconds; one more fails the job. Required; 0 to {MAX_BUDGET_RESTARTS}.",
    )
    window_seconds: Int32 = Field(
        default=3600,
        ge=1,
        le=31_536_000,
        description="windowSeconds is the sliding window the faults are counted in; older ones no longer "
        "count. Optional; default: 3600.",
    )


class PodDisruptionBudgetSpec(ApiModel):
    """A PodDisruptionBudget over the job's worker pods."""

    max_unavailable: Int32 = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "maxUnavailable is how many workers voluntary evictions (node drains, Karpenter consolidation) "
            "may take at once; 0 blocks them until the job ends or the budget is removed. Optional; "
            "default: 0."
        ),
    )


class DisruptionSpec(ApiModel):
    """How the job meets voluntary disruptions: drains, consolidation, preemption."""

    do_not_disrupt: Flag = Field(
        default=False,
        description='doNotDisrupt annotates the worker pods karpenter.sh/do-not-disrupt: "true" (the '
        "spare pods and the store pod too under faultTolerance.launcher Supervisor), so "
        "Karpenter does not consolidate or expire their nodes. Optional; default: false.",
    )
    pod_disruption_budget: PodDisruptionBudgetSpec | None = Field(
        default=None,
        description="podDisruptionBudget makes the operator create a PodDisruptionBudget over the workers "
        "(owned by the job). Optional; default: none (a drain evicts workers, and each saves a checkpoint "
        "on SIGTERM).",
    )
    move_on_notice: Flag = Field(
        default=False,
        description="moveOnNotice moves a worker as soon as its node shows a planned disruption (a cordon, "
        "Karpenter's, the AWS Node Termination Handler's or the cluster autoscaler's taint): it saves a "
        "checkpoint on SIGTERM and its replacement goes to another node before the eviction comes. "
        "Optional; default: false (the worker stays until it is evicted; a spot interruption notice moves "
        "it either way).",
    )


class FailurePolicy(ApiModel):
    """What the operator does when pods or nodes fail."""

    cel_rules = (
        CelRule(
            rule="self.maxBackoffSeconds >= self.backoffSeconds",
            message="maxBackoffSeconds must be at least backoffSeconds",
            check=lambda p: p.max_backoff_seconds >= p.backoff_seconds,
            field_path=".maxBackoffSeconds",
        ),
        CelRule(
            rule=(
                "!has(self.budgets) || "
                "self.budgets.all(b, self.budgets.exists_one(c, c.faultClass == b.faultClass))"
            ),
            message="budgets may name each faultClass once",
            check=lambda p: len({b.fault_class for b in p.budgets}) == len(p.budgets),
            field_path=".budgets",
        ),
    )

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
        le=10000,
        description="maxNodeReplacements is the number of pod replacements for failures (NodeLoss and "
        "ProcessFailure; Disruption too with countDisruptions) before the job is Failed. "
        "Optional; default: 10.",
    )
    count_disruptions: Flag = Field(
        default=False,
        description="countDisruptions makes disruptions (evictions, preemptions, drains, deletions by "
        "others) consume maxNodeReplacements like failures. Optional; default: false.",
    )
    backoff_seconds: Int32 = Field(
        default=5,
        ge=0,
        le=3600,
        description="backoffSeconds is the delay before a replacement after the previous one; it doubles "
        "with each further consecutive fault. Optional; default: 5.",
    )
    max_backoff_seconds: Int32 = Field(
        default=300,
        ge=0,
        le=86400,
        description="maxBackoffSeconds caps the doubled backoff; at least backoffSeconds. "
        "Optional; default: 300.",
    )
    backoff_reset_seconds: Int32 = Field(
        default=600,
        ge=0,
        le=86400,
        description="backoffResetSeconds is how long the job must have been Ready for the next fault to "
        "count as the first of a series again (backoff back to backoffSeconds). Optional; default: 600.",
    )
    repeat_offender_threshold: Int32 = Field(
        default=2,
        ge=1,
        le=1000,
        description="repeatOffenderThreshold is the number of faults on one node before the node is excluded "
        "for the job. Optional; default: 2.",
    )
    taint_excluded_nodes: Flag = Field(
        default=False,
        description="taintExcludedNodes makes the operator taint excluded nodes cluster-wide "
        f"({constants.TAINT_EXCLUDED}:NoSchedule). Optional; default: false.",
    )
    rules: list[FailureRule] = Field(
        default_factory=list,
        max_length=MAX_FAILURE_RULES,
        description="rules choose the action for faults by exit code, fault reason or disruption reason; "
        "the first matching rule wins. Optional; default: empty (each fault class's default action).",
    )
    budgets: list[FaultBudget] = Field(
        default_factory=list,
        max_length=3,
        description="budgets limit the faults of a class within a time window, in addition to "
        "maxNodeReplacements; one per faultClass. Optional; default: empty (no windowed budget).",
    )


# A stall is reported after this long without a training step by default: longer than a checkpoint
# load and a restart of a large job take, far shorter than a lost night.
DEFAULT_STALL_AFTER_SECONDS: int = 600
MAX_STALL_AFTER_SECONDS: int = 7 * 86400


MAX_STEP_LOG_PATTERN_LENGTH: int = 256


def _check_step_log_pattern(pattern: str) -> str:
    """A Python regex with a group for the step: ``step``, else the first group (which must not be
    ``loss``). Checked in Python only: CEL cannot compile a Python regex."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"stepLogPattern is not a Python regular expression: {error}") from None
    if "step" in compiled.groupindex:
        return pattern
    if compiled.groups == 0:
        raise ValueError(
            "stepLogPattern needs a group for the step: a named group (?P<step>...) or any group"
        )
    if compiled.groupindex.get("loss") == 1:
        raise ValueError("stepLogPattern's first group is the loss: name the step's group (?P<step>...)")
    return pattern


StepLogPattern = Annotated[
    str,
    Strict(),
    Field(min_length=1, max_length=MAX_STEP_LOG_PATTERN_LENGTH),
    AfterValidator(_check_step_log_pattern),
]


class ProgressSpec(ApiModel):
    """How the operator judges the training progress its workers report."""

    stall_after_seconds: Int32 = Field(
        default=DEFAULT_STALL_AFTER_SECONDS,
        ge=1,
        le=MAX_STALL_AFTER_SECONDS,
        description=(
            "stallAfterSeconds is how long every worker may be ready while the training step does not "
            "advance before the job is reported Stalled (a condition and a Warning Event; nothing is "
            "restarted). It counts from the step's last advance or from when the workers last all became "
            "ready, whichever is later, so a restart the operator makes is not a stall until its workers "
            f"are ready. Optional; default: {DEFAULT_STALL_AFTER_SECONDS}; 1 to {MAX_STALL_AFTER_SECONDS}."
        ),
    )
    step_log_pattern: StepLogPattern | None = Field(
        default=None,
        description=(
            "stepLogPattern is a Python regular expression that rtj-launch matches against each line the "
            "training processes write (stdout and stderr; the lines still go to the container's log): a "
            "match reports the training step, from the named group step (else the first group), and the "
            "loss from an optional named group loss, as local rank 0 prints them (another rank's when rank "
            "0 prints none). It gives a script of your own, which reports no progress otherwise, a step and "
            "loss in the job's status, recoveries timed to the next step and stall detection; the rtj "
            "library's reports win over it. For example ^step (?P<step>\\d+) loss (?P<loss>\\S+). The API "
            "server cannot compile a Python regex: the operator refuses a job (Ready=False, reason "
            "InvalidSpec) whose pattern does not compile or has no group for the step, and so does "
            f"`rtj render`. Optional; default: none (no step from the log); at most "
            f"{MAX_STEP_LOG_PATTERN_LENGTH} characters."
        ),
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
        description="disruption configures the do-not-disrupt annotation, a PodDisruptionBudget and "
        "moving on notice. Optional.",
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
        description="terminationGracePeriodSeconds is the pods' grace period on deletion: on SIGTERM each "
        "worker finishes its step and commits a checkpoint of it within this time (a drain), then exits. "
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
