"""The trainer container's environment: the contract's variables (rtj_contract.env) from the spec,
the launcher's and the rendezvous', EFA's and NCCL's, then the user's, which win on a clash."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from rtj_contract import env as env_names
from rtj_contract import progress as progress_contract

from rtj_operator import constants, names
from rtj_operator.api import FT_LAUNCHER_CONFIG_MOUNT_PATH, ResilientTrainingJob
from rtj_operator.profiles import processes_per_node, resolve_sizing
from rtj_operator.render.meta import (
    TERMINATION_MESSAGE_PATH,
    ft_launcher_config_map,
    has_store_pod,
    is_supervisor,
    nnodes_max,
    slot,
    spares_in_training,
)
from rtj_operator.render.storage import SCRATCH_HOME

# The AWS EFA/NCCL settings (awsome-distributed-ai NVRx sample); only meaningful with EFA adapters/GPUs.
EFA_ENV = (("FI_PROVIDER", "efa"), ("FI_EFA_USE_DEVICE_RDMA", "1"), ("RDMAV_FORK_SAFE", "1"))


NCCL_ENV = (("NCCL_SOCKET_IFNAME", "^docker,lo,veth"), ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))


PROGRESS_SINK_DEFAULT = "endpoint"

# The node's zone as the pod's label that the API server copies from its node at binding.
NODE_ZONE_FIELD = f"metadata.labels['{constants.LABEL_ZONE}']"


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
    config_map = ft_launcher_config_map(job)
    if config_map is not None:
        env.append((env_names.FT_CONFIG_FILE, f"{FT_LAUNCHER_CONFIG_MOUNT_PATH}/{config_map.key}"))
    return env


def ft_launcher_config_yaml(config: Mapping[str, Any]) -> str:
    """ft_launcher's config file for spec.faultTolerance.ftLauncher.config: its fault_tolerance section
    (NVRx's FaultToleranceConfig.from_yaml_file looks for that key), keys sorted so the bytes are stable."""
    return yaml.safe_dump({"fault_tolerance": dict(config)}, sort_keys=True, default_flow_style=False)


def container_env(job: ResilientTrainingJob, uid: str, *, role: str, index: int) -> list[dict[str, Any]]:
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
        {"name": env_names.NODE_ZONE, "valueFrom": {"fieldRef": {"fieldPath": NODE_ZONE_FIELD}}},
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
