"""The trainer's pods, workers, hot spares and surge pods: one pod spec assembled from the other
concerns."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rtj_contract import progress as progress_contract

from rtj_operator import constants, names
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.profiles import EFA_RESOURCE, GPU_RESOURCE, HUGEPAGES_RESOURCE, resolve_sizing
from rtj_operator.render.env import container_env
from rtj_operator.render.gang import disruption_annotations, gang_annotations, gang_labels, scheduler_name
from rtj_operator.render.meta import TERMINATION_MESSAGE_PATH, job_uid, object_metadata
from rtj_operator.render.placement import Placement, trainer_affinity, trainer_tolerations
from rtj_operator.render.pod_runtime import LAUNCH_COMMAND, runtime_entry, runtime_init_container
from rtj_operator.render.security import pod_security_context, trainer_security_context
from rtj_operator.render.storage import checkpoint_dir_init_container, trainer_volume_mounts, trainer_volumes


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


def pod_init_containers(job: ResilientTrainingJob, *, checkpoint_dir: bool) -> list[dict[str, Any]]:
    """The runtime's copy first, then (`checkpoint_dir`: a trainer pod) the checkpoint directory's."""
    runtime = runtime_init_container(job)
    directory = checkpoint_dir_init_container(job) if checkpoint_dir else None
    return [c for c in (runtime, directory) if c is not None]


@dataclass(frozen=True)
class Replacement:
    """What a worker pod created after a fault carries, so the operator can space replacements.

    `restart_count` is `status.restarts.podReplacement` at the decision (the annotation
    `resilient.training/restart-count`); `replaced_node`, when known, is the node the pod replaces
    (`resilient.training/replaces`).
    """

    restart_count: int
    replaced_node: str = ""


def _pod_metadata(job: ResilientTrainingJob, name: str, uid: str, role: str, index: int) -> dict[str, Any]:
    spec = job.spec
    metadata = object_metadata(job, name, uid)
    labels = {**spec.pod_labels, **gang_labels(job), **metadata["labels"], constants.LABEL_ROLE: role}
    if role == constants.ROLE_WORKER:
        labels[constants.LABEL_WORKER_INDEX] = str(index)
    metadata["labels"] = labels
    annotations = {**spec.pod_annotations, **gang_annotations(job), **disruption_annotations(job, role)}
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def _container(job: ResilientTrainingJob, uid: str, role: str, index: int) -> dict[str, Any]:
    spec = job.spec
    container: dict[str, Any] = {
        "name": names.CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": runtime_entry(job, LAUNCH_COMMAND),
        "args": ["--", *spec.command, *spec.args],
        # A container that fails without writing /dev/termination-log reports the tail of its log:
        # the operator puts that message in the job's condition and Event (observe.observe_pod).
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.working_dir is not None:
        container["workingDir"] = spec.working_dir
    container["env"] = container_env(job, uid, role=role, index=index)
    container["ports"] = [
        {"name": names.RENDEZVOUS_PORT_NAME, "containerPort": spec.rendezvous.port, "protocol": "TCP"},
        {"name": names.PROGRESS_PORT_NAME, "containerPort": progress_contract.PORT, "protocol": "TCP"},
    ]
    container["resources"] = _resources(job)
    container["securityContext"] = trainer_security_context(job)
    container["volumeMounts"] = trainer_volume_mounts(job)
    return container


def base_pod_spec(job: ResilientTrainingJob, name: str, grace_seconds: int) -> dict[str, Any]:
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


def _pod(  # noqa: PLR0913 - `runs_as` is keyword-only, for the one pod whose container plays another role
    job: ResilientTrainingJob, uid: str, role: str, index: int, placement: Placement, *, runs_as: str = ""
) -> dict[str, Any]:
    """The pod of `role` and `index`; its container runs as `runs_as` (the environment's role) if set."""
    spec = job.spec
    name = names.pod_name(job.name, role, index)
    pod_spec = base_pod_spec(job, name, spec.termination_grace_period_seconds)
    if spec.scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(spec.scheduling.node_selector)
    pod_spec["affinity"] = trainer_affinity(job, placement.excluded_nodes, placement.node_name)
    pod_spec["tolerations"] = trainer_tolerations(job)
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    scheduler = scheduler_name(job)
    if scheduler is not None:
        pod_spec["schedulerName"] = scheduler
    pod_spec["securityContext"] = pod_security_context()
    init_containers = pod_init_containers(job, checkpoint_dir=True)
    if init_containers:
        pod_spec["initContainers"] = init_containers
    pod_spec["containers"] = [_container(job, uid, runs_as or role, index)]
    pod_spec["volumes"] = trainer_volumes(job)
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
    pod = _pod(job, job_uid(job, uid), constants.ROLE_WORKER, index, placement)
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
    return _pod(job, job_uid(job, uid), constants.ROLE_SPARE, index, placement)


def render_surge_pod(
    job: ResilientTrainingJob,
    index: int,
    *,
    uid: str | None = None,
    excluded_nodes: Iterable[str] = (),
) -> dict[str, Any]:
    """Surge pod ``index`` (``J-surge-<index>``, label ``role: surge``): asks for a node for worker
    ``index``'s replacement while the old worker pod still checkpoints (`rtj_operator.decide.surges`).

    Rendered as a spare outside the training is, for the same reasons: the worker's container, size
    and hardening, so that the node it gets (and the image it pulls) fit the replacement; its trainer
    runs as a spare (``RTJ_ROLE=spare``: rtj-launch starts no rank and holds the node until SIGTERM).
    The operator makes none where the spares take part in the training.
    """
    if not 0 <= index < job.spec.nodes:
        raise ValueError(f"surge index {index} out of range 0..{job.spec.nodes - 1}")
    placement = Placement(tuple(excluded_nodes), None)
    uid = job_uid(job, uid)
    return _pod(job, uid, constants.ROLE_SURGE, index, placement, runs_as=constants.ROLE_SPARE)
