"""The store pod (Supervisor, or FtLauncher with rendezvous.host StorePod): rtj-store serving the
world's TCP stores or ft_launcher's rendezvous, small, hardened and never beside a worker."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from rtj_contract import env as env_names
from rtj_contract import stores

from rtj_operator import constants, names
from rtj_operator.api import SCRATCH_VOLUME, ResilientTrainingJob
from rtj_operator.profiles import GPU_RESOURCE
from rtj_operator.render.gang import disruption_annotations
from rtj_operator.render.meta import (
    TERMINATION_MESSAGE_PATH,
    has_store_pod,
    is_supervisor,
    job_uid,
    nnodes_max,
    object_metadata,
)
from rtj_operator.render.placement import HOSTNAME_LABEL, trainer_pods_selector, trainer_tolerations
from rtj_operator.render.pod_runtime import runtime_entry, runtime_mounts, runtime_volumes
from rtj_operator.render.pods import base_pod_spec, pod_init_containers
from rtj_operator.render.security import pod_security_context, restricted_security_context
from rtj_operator.render.storage import SCRATCH_HOME, SCRATCH_MOUNTS

# The store pod (faultTolerance.launcher Supervisor): two TCPStore servers in one small process.
STORE_COMMAND = "rtj-store"


STORE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}}


# It holds no state worth a drain: a short grace period, so a gang restart gets its new store soon.
STORE_TERMINATION_GRACE_SECONDS = 5


STORE_SCRATCH_SIZE_LIMIT = "1Gi"


# Readiness: the world's store accepts connections (a kubelet without TCP probes treats it as ready).
STORE_READINESS_PERIOD_SECONDS = 2


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
    owner = job_uid(job, uid)
    name = names.store_pod_name(job.name)
    metadata = object_metadata(job, name, owner)
    metadata["labels"] = {**spec.pod_labels, **metadata["labels"], constants.LABEL_ROLE: constants.ROLE_STORE}
    annotations = {**spec.pod_annotations, **disruption_annotations(job, constants.ROLE_STORE)}
    if annotations:
        metadata["annotations"] = annotations
    pod_spec: dict[str, Any] = {
        **base_pod_spec(job, name, STORE_TERMINATION_GRACE_SECONDS),
        "affinity": _store_affinity(job, excluded_nodes),
        "tolerations": _store_tolerations(job),
    }
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    pod_spec["securityContext"] = pod_security_context()
    init_containers = pod_init_containers(job, checkpoint_dir=False)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    pod_spec["containers"] = [_store_container(job, owner)]
    pod_spec["volumes"] = [
        {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": STORE_SCRATCH_SIZE_LIMIT}},
        *runtime_volumes(job),
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
        "command": [*runtime_entry(job, STORE_COMMAND), *_store_args(job, uid)],
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": env,
        "ports": [
            {"name": name, "containerPort": number, "protocol": "TCP"} for name, number in store_ports(job)
        ],
        "readinessProbe": {
            "tcpSocket": {"port": port},
            "periodSeconds": STORE_READINESS_PERIOD_SECONDS,
            "failureThreshold": 3,
        },
        "resources": copy.deepcopy(STORE_RESOURCES),
        "securityContext": restricted_security_context(),
        "volumeMounts": [
            *({"name": SCRATCH_VOLUME, "mountPath": path, "subPath": sub} for path, sub in SCRATCH_MOUNTS),
            *runtime_mounts(job),
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


def store_ports(job: ResilientTrainingJob) -> list[tuple[str, int]]:
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
                {"labelSelector": trainer_pods_selector(job), "topologyKey": HOSTNAME_LABEL}
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
    return [t for t in trainer_tolerations(job) if t != gpu]
