"""The pure renderer: a parsed ResilientTrainingJob in, the Kubernetes objects it needs out.

No I/O and no clock: the same job, uid and excluded nodes always give the same objects (and the same
YAML bytes), so the operator can re-render at any time and compare. :func:`render` returns every child
(docs/architecture.md, "What the renderer produces"); the operator's decisions
(:mod:`rtj_operator.decide`) call :func:`render_base`, :func:`render_worker_pod` (a replacement
included, with its annotations) and :func:`render_spare_pod` and send what they return as it is.
Names come from :mod:`rtj_operator.names`, sizing from :mod:`rtj_operator.profiles`, label and
annotation names from :mod:`rtj_operator.constants`, the environment's from :mod:`rtj_contract.env`
(the trainer reads the same names).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from rtj_contract import env as env_names
from rtj_contract import progress as progress_contract
from rtj_contract import stores

from rtj_operator import constants, names
from rtj_operator.api import (
    CHECKPOINT_VOLUME,
    FT_LAUNCHER_CONFIG_MOUNT_PATH,
    FT_LAUNCHER_CONFIG_VOLUME,
    RUNTIME_MOUNT_PATH,
    RUNTIME_VOLUME,
    SCRATCH_VOLUME,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
    FtLauncherConfigMap,
    Launcher,
    ResilientTrainingJob,
    RetentionPolicy,
)
from rtj_operator.api import has_store_pod as api_has_store_pod
from rtj_operator.api import spares_in_training as api_spares_in_training
from rtj_operator.profiles import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    HUGEPAGES_RESOURCE,
    processes_per_node,
    resolve_sizing,
)

__all__ = [
    "Replacement",
    "checkpoint_claim_name",
    "ft_launcher_config_yaml",
    "has_store_pod",
    "is_supervisor",
    "render",
    "render_base",
    "render_pod_disruption_budget",
    "render_pod_group",
    "render_service",
    "render_service_account",
    "render_spare_pod",
    "render_storage",
    "render_store_pod",
    "render_worker_pod",
]

LAUNCH_COMMAND = "rtj-launch"
# rtj-launch's init-container mode (rtj_trainer.runtime.launch): prepare the job's checkpoint directory.
PREPARE_CHECKPOINT_DIR_ARG = "--prepare-checkpoint-dir"
# rtj-launch's other init-container mode (rtj_trainer.runtime.install): copy the runtime into a volume;
# the interpreter of the user's image that then runs it, and the volume's and the copy's sizes.
INSTALL_RUNTIME_ARG = "--install-runtime"
RUNTIME_PYTHON = "python3"
RUNTIME_SIZE_LIMIT = "256Mi"
RUNTIME_INIT_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}}
# Where the kubelet reads a container's termination message (Kubernetes' default path).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# Taints the node lifecycle controller puts on a lost node; DefaultTolerationSeconds would otherwise
# give every pod 300 s on them (FIELD_NOTES: ~5 min 50 s before eviction).
NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
# The AWS EFA/NCCL settings (awsome-distributed-ai NVRx sample); only meaningful with EFA adapters/GPUs.
EFA_ENV = (("FI_PROVIDER", "efa"), ("FI_EFA_USE_DEVICE_RDMA", "1"), ("RDMAV_FORK_SAFE", "1"))
NCCL_ENV = (("NCCL_SOCKET_IFNAME", "^docker,lo,veth"), ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))
PROGRESS_SINK_DEFAULT = "endpoint"
# The root filesystem of a trainer container is read-only; these are where it may write, each a
# subdirectory of one disk-backed emptyDir: ft_launcher's IPC sockets, torch.compile/inductor caches
# and Python's temporary files go to /tmp; Triton's cache (~/.triton), CUDA's JIT cache (~/.nv) and
# anything else under HOME to SCRATCH_HOME, which the pod's HOME points at.
SCRATCH_HOME = "/home/rtj"
SCRATCH_MOUNTS = (("/tmp", "tmp"), (SCRATCH_HOME, "home"))
SCRATCH_SIZE_LIMIT = "16Gi"
# EFA registers (pins) memory for RDMA; the only capability a trainer container ever adds.
EFA_CAPABILITIES = ("IPC_LOCK",)
# The store pod (faultTolerance.launcher Supervisor): two TCPStore servers in one small process.
STORE_COMMAND = "rtj-store"
STORE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}}
# It holds no state worth a drain: a short grace period, so a gang restart gets its new store soon.
STORE_TERMINATION_GRACE_SECONDS = 5
STORE_SCRATCH_SIZE_LIMIT = "1Gi"
# Readiness: the world's store accepts connections (a kubelet without TCP probes treats it as ready).
STORE_READINESS_PERIOD_SECONDS = 2


# --- names (derived in `rtj_operator.names`) ---------------------------------------------------------------


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


# --- shared pieces ----------------------------------------------------------------------------------------


def _labels(job: ResilientTrainingJob) -> dict[str, str]:
    return {
        constants.LABEL_JOB: job.name,
        constants.LABEL_APP_NAME: constants.APP_NAME,
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
    }


def _owner_references(job: ResilientTrainingJob, uid: str) -> list[dict[str, Any]]:
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


def _metadata(
    job: ResilientTrainingJob, name: str, uid: str | None, *, namespaced: bool = True
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = job.namespace
    meta["labels"] = _labels(job)
    if uid is not None:
        meta["ownerReferences"] = _owner_references(job, uid)
    return meta


def _job_uid(job: ResilientTrainingJob, uid: str | None) -> str:
    resolved = uid or job.metadata.uid
    if not resolved:
        raise ValueError(f"job {job.namespace}/{job.name} has no uid: pass uid= (owner references need one)")
    return resolved


# --- pods -------------------------------------------------------------------------------------------------


def _supervisor_env(job: ResilientTrainingJob, role: str, index: int) -> list[tuple[str, str]]:
    """The Supervisor launcher's variables: the pod's slot, the world's size, the store pod's address."""
    spec = job.spec
    return [
        (env_names.LAUNCH_MODE, env_names.LAUNCH_MODE_SUPERVISOR),
        (env_names.SLOT, str(slot(job, role, index))),
        (env_names.SLOTS, str(spec.nodes + spec.hot_spares)),
        (env_names.STORE_HOST, names.store_host(job.name, job.namespace)),
        (env_names.STORE_PORT, str(spec.rendezvous.port)),
        (env_names.MEMORY_INTERVAL_STEPS, str(spec.checkpoint.memory_interval_steps)),
    ]


def _rendezvous_env(job: ResilientTrainingJob) -> list[tuple[str, str]]:
    """Where ft_launcher's rendezvous is: worker 0's name, or the store pod's. With a store pod the
    store's address is set too, which tells rtj-launch that no worker hosts the rendezvous."""
    port = str(job.spec.rendezvous.port)
    if not has_store_pod(job) or is_supervisor(job):  # Supervisor's store variables: _supervisor_env
        return [
            (env_names.RDZV_HOST, names.rendezvous_host(job.name, job.namespace)),
            (env_names.RDZV_PORT, port),
        ]
    store = names.store_host(job.name, job.namespace)
    return [
        (env_names.RDZV_HOST, store),
        (env_names.RDZV_PORT, port),
        (env_names.STORE_HOST, store),
        (env_names.STORE_PORT, port),
    ]


def _optional_env(job: ResilientTrainingJob) -> list[tuple[str, str]]:
    """The variables of optional fields (constants.ENV_WHEN_SET), each only where its field is set."""
    spec = job.spec
    env: list[tuple[str, str]] = []
    if spec.progress.step_log_pattern is not None:
        env.append((env_names.STEP_LOG_PATTERN, spec.progress.step_log_pattern))
    ft_launcher = spec.fault_tolerance.ft_launcher
    if ft_launcher is not None and ft_launcher.config is not None:
        env.append((env_names.FT_CONFIG, ft_launcher_config_yaml(ft_launcher.config)))
    config_map = _ft_launcher_config_map(job)
    if config_map is not None:
        env.append((env_names.FT_CONFIG_FILE, f"{FT_LAUNCHER_CONFIG_MOUNT_PATH}/{config_map.key}"))
    return env


def ft_launcher_config_yaml(config: Mapping[str, Any]) -> str:
    """ft_launcher's config file for spec.faultTolerance.ftLauncher.config: its fault_tolerance section
    (NVRx's FaultToleranceConfig.from_yaml_file looks for that key), keys sorted so the bytes are stable."""
    return yaml.safe_dump({"fault_tolerance": dict(config)}, sort_keys=True, default_flow_style=False)


def _ft_launcher_config_map(job: ResilientTrainingJob) -> FtLauncherConfigMap | None:
    ft_launcher = job.spec.fault_tolerance.ft_launcher
    return ft_launcher.config_map if ft_launcher is not None else None


def _env(job: ResilientTrainingJob, uid: str, *, role: str, index: int) -> list[dict[str, Any]]:
    spec = job.spec
    ft = spec.fault_tolerance
    ip = ft.in_process
    ckpt = spec.checkpoint
    env: list[dict[str, Any]] = [
        {"name": env_names.JOB_NAME, "value": job.name},
        {"name": env_names.NAMESPACE, "value": job.namespace},
        {"name": env_names.JOB_UID, "value": uid},
        {"name": env_names.ROLE, "value": role},
        {"name": env_names.POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": env_names.NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": env_names.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    plain: list[tuple[str, str]] = []
    supervisor = is_supervisor(job)
    if spares_in_training(job):
        # Every pod takes part, a spare too: its node rank is its slot (under FtLauncher, the
        # infrastructure rank that orders the rendezvous' nodes, a spare's after the workers').
        plain.append((env_names.NODE_RANK, str(slot(job, role, index))))
    elif role == constants.ROLE_WORKER:
        plain.append((env_names.NODE_RANK, str(index)))
    plain += [
        (env_names.NNODES, str(spec.nodes)),
        # Spares holding nodes stay outside the rendezvous; standby spares are in it.
        (env_names.NNODES_MAX, str(nnodes_max(job))),
        (env_names.NPROC_PER_NODE, str(processes_per_node(spec))),
        *_rendezvous_env(job),
        (env_names.CHECKPOINT_DIR, names.checkpoint_dir(job.name, job.spec.checkpoint.mount_path)),
        (env_names.CHECKPOINT_INTERVAL_STEPS, str(ckpt.interval_steps)),
        (env_names.CHECKPOINT_KEEP, str(ckpt.keep)),
        (env_names.CHECKPOINT_MODE, ckpt.mode.value),
        (env_names.FT_HEARTBEAT_TIMEOUT_SECONDS, str(ft.heartbeat_timeout_seconds)),
        (env_names.FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS, str(ft.initial_heartbeat_timeout_seconds)),
        (env_names.FT_MONITOR_INTERVAL_SECONDS, str(ft.monitor_interval_seconds)),
        (env_names.MAX_RESTARTS, str(ft.max_in_job_restarts)),
        (env_names.INPROCESS_ENABLED, "true" if ip.enabled else "false"),
        (env_names.INPROCESS_MAX_ITERATIONS, str(ip.max_iterations)),
        (env_names.INPROCESS_SOFT_TIMEOUT_SECONDS, str(ip.soft_timeout_seconds)),
        (env_names.INPROCESS_HARD_TIMEOUT_SECONDS, str(ip.hard_timeout_seconds)),
        (env_names.INPROCESS_BARRIER_TIMEOUT_SECONDS, str(ip.barrier_timeout_seconds)),
        (env_names.PROGRESS_SINK, PROGRESS_SINK_DEFAULT),
        (env_names.PROGRESS_PORT, str(progress_contract.PORT)),
        (env_names.TERMINATION_MESSAGE_PATH, TERMINATION_MESSAGE_PATH),
        *_optional_env(job),
    ]
    if supervisor:
        plain += _supervisor_env(job, role, index)
    sizing = resolve_sizing(spec.instance_type, spec.resources)
    if sizing.efa_adapters > 0:
        plain += list(EFA_ENV)
    if sizing.gpus > 0:
        plain += list(NCCL_ENV)
    plain.append(("HOME", SCRATCH_HOME))
    env += [{"name": name, "value": value} for name, value in plain]
    # The user's entries win on a name clash: drop ours rather than rely on "last one wins".
    overridden = {var.name for var in spec.env}
    env = [var for var in env if var["name"] not in overridden]
    env += [var.model_dump(by_alias=True, exclude_none=True) for var in spec.env]
    return env


def _resources(job: ResilientTrainingJob) -> dict[str, Any]:
    sizing = resolve_sizing(job.spec.instance_type, job.spec.resources)
    limits: dict[str, str] = {"memory": sizing.memory}
    if sizing.gpus > 0:
        limits[GPU_RESOURCE] = str(sizing.gpus)
    if sizing.efa_adapters > 0:
        limits[EFA_RESOURCE] = str(sizing.efa_adapters)
    if sizing.hugepages_2mi is not None:
        limits[HUGEPAGES_RESOURCE] = sizing.hugepages_2mi
    # Requests equal limits for every resource but CPU, which has no limit (no CFS throttling).
    return {"requests": {"cpu": sizing.cpu, **limits}, "limits": limits}


def _affinity(
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
                {"labelSelector": _trainer_pods_selector(job), "topologyKey": HOSTNAME_LABEL}
            ]
        },
    }


def _trainer_pods_selector(job: ResilientTrainingJob) -> dict[str, Any]:
    """The job's worker and spare pods. A store pod carries the job's label too, and must neither steer
    the workers' zone (pod affinity) nor count as their peer: it is kept out."""
    selector: dict[str, Any] = {"matchLabels": names.selector_labels(job.name)}
    if has_store_pod(job):
        selector["matchExpressions"] = [
            {
                "key": constants.LABEL_ROLE,
                "operator": "In",
                "values": [constants.ROLE_WORKER, constants.ROLE_SPARE],
            }
        ]
    return selector


def _tolerations(job: ResilientTrainingJob) -> list[dict[str, Any]]:
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


def _volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    sizing = resolve_sizing(job.spec.instance_type, job.spec.resources)
    return [
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": checkpoint_claim_name(job)}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": sizing.shm_size}},
        _scratch_volume(),
        *_ft_launcher_config_volumes(job),
        *_runtime_volumes(job),
        *(v.model_dump(by_alias=True, exclude_none=True, mode="json") for v in job.spec.volumes),
    ]


def _volume_mounts(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    ft_launcher_config = [
        {"name": FT_LAUNCHER_CONFIG_VOLUME, "mountPath": FT_LAUNCHER_CONFIG_MOUNT_PATH, "readOnly": True}
    ]
    return [
        {"name": CHECKPOINT_VOLUME, "mountPath": job.spec.checkpoint.mount_path},
        {"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH},
        *_scratch_mounts(job),
        *(ft_launcher_config if _ft_launcher_config_map(job) is not None else []),
        *_runtime_mounts(job),
        *(m.model_dump(by_alias=True, exclude_none=True, mode="json") for m in job.spec.volume_mounts),
    ]


def _ft_launcher_config_volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """The ConfigMap of spec.faultTolerance.ftLauncher.configMap, its one key as a file of that name (a
    missing ConfigMap or key holds the pod in ContainerCreating until it exists)."""
    config_map = _ft_launcher_config_map(job)
    if config_map is None:
        return []
    source = {"name": config_map.name, "items": [{"key": config_map.key, "path": config_map.key}]}
    return [{"name": FT_LAUNCHER_CONFIG_VOLUME, "configMap": source}]


# --- hardening: the container's security context and the writable paths it needs ------------------------


def _scratch_volume() -> dict[str, Any]:
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


def _container_security_context(job: ResilientTrainingJob) -> dict[str, Any]:
    """Least privilege for the trainer: the Pod Security `restricted` settings, but for IPC_LOCK on EFA.

    Non-root (the image must name a numeric non-root user, or the pod set runAsUser), no privilege
    escalation, the runtime's default seccomp profile, a read-only root filesystem (writes go to the
    volumes above) and every capability dropped; nodes with EFA adapters add back IPC_LOCK for RDMA
    memory registration (docs/security.md says when it takes effect).
    """
    context = _restricted_security_context()
    if resolve_sizing(job.spec.instance_type, job.spec.resources).efa_adapters > 0:
        context["capabilities"]["add"] = list(EFA_CAPABILITIES)
    return context


def _restricted_security_context() -> dict[str, Any]:
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


# --- the pod runtime from spec.runtimeImage (rtj_trainer.runtime.install) ----------------------------------


def _runtime_entry(job: ResilientTrainingJob, command: str) -> list[str]:
    """How a container runs the runtime's `command` (rtj-launch, rtj-store): from the image, or, with
    spec.runtimeImage, its entry script in the runtime volume under the image's own python3."""
    if job.spec.runtime_image is None:
        return [command]
    return [RUNTIME_PYTHON, f"{RUNTIME_MOUNT_PATH}/{command}.py"]


def _runtime_init_container(job: ResilientTrainingJob) -> dict[str, Any] | None:
    """Copies the runtime from spec.runtimeImage into the runtime volume; None without one."""
    spec = job.spec
    if spec.runtime_image is None:
        return None
    return {
        "name": names.RUNTIME_INIT_CONTAINER_NAME,
        "image": spec.runtime_image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": [LAUNCH_COMMAND, INSTALL_RUNTIME_ARG, RUNTIME_MOUNT_PATH],
        "resources": copy.deepcopy(RUNTIME_INIT_RESOURCES),
        "securityContext": _restricted_security_context(),
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT_PATH}],
    }


def _runtime_volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    if job.spec.runtime_image is None:
        return []
    return [{"name": RUNTIME_VOLUME, "emptyDir": {"sizeLimit": RUNTIME_SIZE_LIMIT}}]


def _runtime_mounts(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """Read-only in the containers that run it: only the init container writes the runtime."""
    if job.spec.runtime_image is None:
        return []
    return [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT_PATH, "readOnly": True}]


def _init_containers(job: ResilientTrainingJob, *, checkpoint_dir: bool) -> list[dict[str, Any]]:
    """The runtime's copy first, then (`checkpoint_dir`: a trainer pod) the checkpoint directory's."""
    runtime = _runtime_init_container(job)
    directory = _checkpoint_dir_init_container(job) if checkpoint_dir else None
    return [c for c in (runtime, directory) if c is not None]


# --- placement, disruption, gang admission, checkpoint ownership ---------------------------------------


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
            {"labelSelector": _trainer_pods_selector(job), "topologyKey": key} for key in keys
        ]
    }


def _disruption_annotations(job: ResilientTrainingJob, role: str) -> dict[str, str]:
    """karpenter.sh/do-not-disrupt when spec.disruption.doNotDisrupt: on workers, on the store pod (its
    loss restarts every pod), and on the spares where they take part in the training (Supervisor's
    reserve ranks, FtLauncher's standby nodes: either may be training); spares holding nodes may go."""
    protected = role in (constants.ROLE_WORKER, constants.ROLE_STORE) or spares_in_training(job)
    if protected and job.spec.disruption.do_not_disrupt:
        return {constants.ANNOTATION_DO_NOT_DISRUPT: "true"}
    return {}


def _pod_group_size(job: ResilientTrainingJob) -> int:
    return job.spec.nodes + job.spec.hot_spares


def _gang_labels(job: ResilientTrainingJob) -> dict[str, str]:
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


def _gang_annotations(job: ResilientTrainingJob) -> dict[str, str]:
    """Kueue admits a pod group once this many pods of it exist: every worker and spare."""
    gang = job.spec.scheduling.gang
    if gang is None or gang.kueue is None:
        return {}
    return {constants.ANNOTATION_KUEUE_POD_GROUP_TOTAL: str(_pod_group_size(job))}


def _scheduler_name(job: ResilientTrainingJob) -> str | None:
    gang = job.spec.scheduling.gang
    return gang.coscheduling.scheduler_name if gang is not None and gang.coscheduling is not None else None


def _pod_security_context() -> dict[str, Any]:
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


def _checkpoint_dir_init_container(job: ResilientTrainingJob) -> dict[str, Any] | None:
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


def _volume_zone_affinity(job: ResilientTrainingJob) -> dict[str, Any]:
    """A zonal PersistentVolume's nodeAffinity (the scheduler's volume binding checks it too)."""
    zone = _zone_requirements(job)
    if not zone:
        return {}
    return {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": zone}]}}}


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
        "metadata": _metadata(job, names.disruption_budget_name(job.name), _job_uid(job, uid)),
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
        "metadata": _metadata(job, names.pod_group_name(job.name), _job_uid(job, uid)),
        "spec": {
            "minMember": job.spec.nodes,
            "scheduleTimeoutSeconds": gang.coscheduling.schedule_timeout_seconds,
        },
    }


@dataclass(frozen=True)
class Replacement:
    """What a worker pod created after a fault carries, so the operator can space replacements.

    `restart_count` is `status.restarts.podReplacement` at the decision (the annotation
    `resilient.training/restart-count`); `replaced_node`, when known, is the node the pod replaces
    (`resilient.training/replaces`).
    """

    restart_count: int
    replaced_node: str = ""


@dataclass(frozen=True)
class Placement:
    """Where a pod may go: kept off `excluded_nodes`, pinned to `node_name` if set."""

    excluded_nodes: tuple[str, ...] = ()
    node_name: str | None = None


def _pod_metadata(job: ResilientTrainingJob, name: str, uid: str, role: str, index: int) -> dict[str, Any]:
    spec = job.spec
    metadata = _metadata(job, name, uid)
    labels = {**spec.pod_labels, **_gang_labels(job), **metadata["labels"], constants.LABEL_ROLE: role}
    if role == constants.ROLE_WORKER:
        labels[constants.LABEL_WORKER_INDEX] = str(index)
    metadata["labels"] = labels
    annotations = {**spec.pod_annotations, **_gang_annotations(job), **_disruption_annotations(job, role)}
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def _container(job: ResilientTrainingJob, uid: str, role: str, index: int) -> dict[str, Any]:
    spec = job.spec
    container: dict[str, Any] = {
        "name": names.CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": _runtime_entry(job, LAUNCH_COMMAND),
        "args": ["--", *spec.command, *spec.args],
        # A container that fails without writing /dev/termination-log reports the tail of its log:
        # the operator puts that message in the job's condition and Event (observe.observe_pod).
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.working_dir is not None:
        container["workingDir"] = spec.working_dir
    container["env"] = _env(job, uid, role=role, index=index)
    container["ports"] = [
        {"name": names.RENDEZVOUS_PORT_NAME, "containerPort": spec.rendezvous.port, "protocol": "TCP"},
        {"name": names.PROGRESS_PORT_NAME, "containerPort": progress_contract.PORT, "protocol": "TCP"},
    ]
    container["resources"] = _resources(job)
    container["securityContext"] = _container_security_context(job)
    container["volumeMounts"] = _volume_mounts(job)
    return container


def _base_pod_spec(job: ResilientTrainingJob, name: str, grace_seconds: int) -> dict[str, Any]:
    """What every pod of the job shares: its DNS name under the job's Service, no restarts by the
    kubelet, the trainer's ServiceAccount without a token (no pod calls the Kubernetes API: progress
    goes out through the endpoint)."""
    return {
        "hostname": name,
        "subdomain": names.service_name(job.name),
        "restartPolicy": "Never",
        "serviceAccountName": names.trainer_name(job.name),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_seconds,
    }


def _pod(job: ResilientTrainingJob, uid: str, role: str, index: int, placement: Placement) -> dict[str, Any]:
    spec = job.spec
    name = names.pod_name(job.name, role, index)
    pod_spec = _base_pod_spec(job, name, spec.termination_grace_period_seconds)
    if spec.scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(spec.scheduling.node_selector)
    pod_spec["affinity"] = _affinity(job, placement.excluded_nodes, placement.node_name)
    pod_spec["tolerations"] = _tolerations(job)
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    scheduler = _scheduler_name(job)
    if scheduler is not None:
        pod_spec["schedulerName"] = scheduler
    pod_spec["securityContext"] = _pod_security_context()
    init_containers = _init_containers(job, checkpoint_dir=True)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    pod_spec["containers"] = [_container(job, uid, role, index)]
    pod_spec["volumes"] = _volumes(job)
    metadata = _pod_metadata(job, name, uid, role, index)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def render_worker_pod(  # noqa: PLR0913 - keyword-only, each a named field; callers pass them by name
    job: ResilientTrainingJob,
    index: int,
    *,
    uid: str | None = None,
    excluded_nodes: Iterable[str] = (),
    node_name: str | None = None,
    replacement: Replacement | None = None,
) -> dict[str, Any]:
    """Worker pod ``index`` (``J-worker-<index>``), kept off ``excluded_nodes``.

    ``node_name`` pins the pod onto that node through required node affinity (the scheduler still
    waits for the node's resources, e.g. while a deleted spare terminates there): the operator's
    fast replacement onto a hot spare's node. ``replacement`` marks a pod created after a fault.
    """
    if not 0 <= index < job.spec.nodes:
        raise ValueError(f"worker index {index} out of range 0..{job.spec.nodes - 1}")
    placement = Placement(tuple(excluded_nodes), node_name)
    pod = _pod(job, _job_uid(job, uid), constants.ROLE_WORKER, index, placement)
    if replacement is not None:
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations[constants.ANNOTATION_RESTART_COUNT] = str(replacement.restart_count)
        if replacement.replaced_node:
            annotations[constants.ANNOTATION_REPLACES] = replacement.replaced_node
    return pod


def render_spare_pod(
    job: ResilientTrainingJob,
    index: int,
    *,
    uid: str | None = None,
    excluded_nodes: Iterable[str] = (),
    node_name: str | None = None,
) -> dict[str, Any]:
    """Hot spare pod ``index`` (``J-spare-<index>``): sized like a worker; outside the training, holding
    its node, unless the spares take part in it (`spares_in_training`)."""
    if not 0 <= index < job.spec.hot_spares:
        raise ValueError(f"spare index {index} out of range 0..{job.spec.hot_spares - 1}")
    placement = Placement(tuple(excluded_nodes), node_name)
    return _pod(job, _job_uid(job, uid), constants.ROLE_SPARE, index, placement)


# --- the store pod (Supervisor, or FtLauncher with rendezvous.host StorePod) ------------------------------


def render_store_pod(
    job: ResilientTrainingJob, *, uid: str | None = None, excluded_nodes: Iterable[str] = ()
) -> dict[str, Any]:
    """The store pod ``J-store``. Supervisor: ``rtj-store --port P`` serves the world's TCP stores on
    rendezvous.port P (NVRx's wrapper store) and P + 1 (the process groups'). FtLauncher with
    rendezvous.host StorePod: ``rtj-store --port P --rendezvous-id UID --nnodes N`` hosts
    ft_launcher's rendezvous on P, so that no worker's node holds it (``--nnodes-max N+S`` when the S
    spares stand by in it).

    Small (100m CPU, 256Mi), no GPU, EFA or instance-type requirement, hardened like the trainer, and
    never on a node that runs one of the job's workers or spares (required pod anti-affinity), so that
    losing a worker's node never takes the store with it. It tolerates the job's own tolerations and the
    node-loss taints for nodeLossGraceSeconds, like the workers. Its hostname and subdomain give it the
    stable name ``J-store.<service>.<ns>.svc`` (RTJ_STORE_HOST on the workers).
    """
    if not has_store_pod(job):
        raise ValueError(
            f"job {job.namespace}/{job.name} has no store pod: faultTolerance.launcher is not Supervisor "
            "and rendezvous.host is not StorePod"
        )
    spec = job.spec
    owner = _job_uid(job, uid)
    name = names.store_pod_name(job.name)
    metadata = _metadata(job, name, owner)
    metadata["labels"] = {**spec.pod_labels, **metadata["labels"], constants.LABEL_ROLE: constants.ROLE_STORE}
    annotations = {**spec.pod_annotations, **_disruption_annotations(job, constants.ROLE_STORE)}
    if annotations:
        metadata["annotations"] = annotations
    pod_spec: dict[str, Any] = {
        **_base_pod_spec(job, name, STORE_TERMINATION_GRACE_SECONDS),
        "affinity": _store_affinity(job, excluded_nodes),
        "tolerations": _store_tolerations(job),
    }
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    pod_spec["securityContext"] = _pod_security_context()
    init_containers = _init_containers(job, checkpoint_dir=False)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    pod_spec["containers"] = [_store_container(job, owner)]
    pod_spec["volumes"] = [
        {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": STORE_SCRATCH_SIZE_LIMIT}},
        *_runtime_volumes(job),
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _store_container(job: ResilientTrainingJob, uid: str) -> dict[str, Any]:
    spec, c = job.spec, constants
    port = spec.rendezvous.port
    env = [
        {"name": env_names.JOB_NAME, "value": job.name},
        {"name": env_names.NAMESPACE, "value": job.namespace},
        {"name": env_names.JOB_UID, "value": uid},
        {"name": env_names.ROLE, "value": c.ROLE_STORE},
        {"name": env_names.POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": env_names.TERMINATION_MESSAGE_PATH, "value": TERMINATION_MESSAGE_PATH},
        {"name": "HOME", "value": SCRATCH_HOME},
    ]
    return {
        "name": names.STORE_CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": [*_runtime_entry(job, STORE_COMMAND), *_store_args(job, uid)],
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": env,
        "ports": [
            {"name": name, "containerPort": number, "protocol": "TCP"} for name, number in _store_ports(job)
        ],
        "readinessProbe": {
            "tcpSocket": {"port": port},
            "periodSeconds": STORE_READINESS_PERIOD_SECONDS,
            "failureThreshold": 3,
        },
        "resources": copy.deepcopy(STORE_RESOURCES),
        "securityContext": _restricted_security_context(),
        "volumeMounts": [
            *({"name": SCRATCH_VOLUME, "mountPath": path, "subPath": sub} for path, sub in SCRATCH_MOUNTS),
            *_runtime_mounts(job),
        ],
    }


def _store_args(job: ResilientTrainingJob, uid: str) -> list[str]:
    """rtj-store's arguments: the ports; for FtLauncher the rendezvous it hosts (id and node count)."""
    port = ["--port", str(job.spec.rendezvous.port)]
    if is_supervisor(job):
        return port
    nodes = ["--nnodes", str(job.spec.nodes)]
    if nnodes_max(job) > job.spec.nodes:
        nodes += ["--nnodes-max", str(nnodes_max(job))]
    return [*port, "--rendezvous-id", uid, *nodes]


def _store_ports(job: ResilientTrainingJob) -> list[tuple[str, int]]:
    """The store pod's named ports: P, and under Supervisor P + 1 (the process groups' store)."""
    port = job.spec.rendezvous.port
    if not is_supervisor(job):
        return [(names.STORE_PORT_NAME, port)]
    return [
        (names.STORE_PORT_NAME, port + stores.WRAPPER_STORE_OFFSET),
        (names.STORE_GROUPS_PORT_NAME, port + stores.PG_STORE_OFFSET),
    ]


def _store_affinity(job: ResilientTrainingJob, excluded_nodes: Iterable[str]) -> dict[str, Any]:
    """Off the job's excluded nodes, and never beside one of its workers or spares."""
    affinity: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": _trainer_pods_selector(job), "topologyKey": HOSTNAME_LABEL}
            ]
        }
    }
    excluded = sorted(set(excluded_nodes))
    if excluded:
        term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": excluded}]}
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    return affinity


def _store_tolerations(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """The workers' node-loss tolerations and the job's own; not the GPU one (it may run anywhere)."""
    gpu = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    return [t for t in _tolerations(job) if t != gpu]


# --- the other children -----------------------------------------------------------------------------------


def render_service(job: ResilientTrainingJob, *, uid: str | None = None) -> dict[str, Any]:
    """The headless Service: DNS records for workers before they are ready (rendezvous needs them).

    With a store pod it selects every pod of the job, so that the store pod has its DNS name too (a
    pod's hostname record needs the Service to select it), and names the store's ports.
    """
    port = job.spec.rendezvous.port
    selector = {**names.selector_labels(job.name), constants.LABEL_ROLE: constants.ROLE_WORKER}
    ports = [{"name": names.RENDEZVOUS_PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}]
    if has_store_pod(job):
        selector = names.selector_labels(job.name)
        ports = [
            {"name": name, "port": number, "targetPort": number, "protocol": "TCP"}
            for name, number in _store_ports(job)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(job.name), _job_uid(job, uid)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": ports,
        },
    }


def render_storage(job: ResilientTrainingJob, *, uid: str | None = None) -> list[dict[str, Any]]:
    """The checkpoint PVC (and the static PV for FSx); nothing when an existing claim is named."""
    ckpt = job.spec.checkpoint
    storage = ckpt.storage
    if storage.existing_claim is not None:
        return []
    owner = _job_uid(job, uid) if ckpt.retention_policy is RetentionPolicy.DELETE else None
    objects: list[dict[str, Any]] = []
    claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"]}
    if storage.fsx_static is not None:
        fsx = storage.fsx_static
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                # Cluster-scoped: never owned by a namespaced job; Retain keeps the file system's data.
                "metadata": _metadata(job, names.pv_name(job.name, job.namespace), None, namespaced=False),
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
                    **_volume_zone_affinity(job),
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
            "metadata": _metadata(job, names.pvc_name(job.name), owner),
            "spec": claim_spec,
        }
    )
    return objects


def render_service_account(job: ResilientTrainingJob, *, uid: str | None = None) -> list[dict[str, Any]]:
    """The job's own ServiceAccount, bound to no Role and without a token mounted: the trainer calls
    no Kubernetes API, and a compromised worker must not be able to change any pod (its own
    sibling's image, say). An account of its own, rather than the namespace's `default`, keeps
    whatever a cluster grants `default` away from the trainer, and gives IRSA or Pod Identity a
    place to attach cloud credentials."""
    owner = _job_uid(job, uid)
    name = names.trainer_name(job.name)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(job, name, owner),
            "automountServiceAccountToken": False,
        }
    ]


def render_base(job: ResilientTrainingJob, *, uid: str | None = None) -> list[dict[str, Any]]:
    """The children other than pods, in creation order: ServiceAccount, storage, Service, then the
    opt-in PodDisruptionBudget and coscheduling PodGroup."""
    owner = _job_uid(job, uid)
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
    owner = _job_uid(job, uid)
    excluded = tuple(excluded_nodes)
    return [
        *render_base(job, uid=owner),
        *([render_store_pod(job, uid=owner, excluded_nodes=excluded)] if has_store_pod(job) else []),
        *(render_worker_pod(job, i, uid=owner, excluded_nodes=excluded) for i in range(job.spec.nodes)),
        *(render_spare_pod(job, k, uid=owner, excluded_nodes=excluded) for k in range(job.spec.hot_spares)),
    ]
