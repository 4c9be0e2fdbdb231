"""The environment contract between the operator and the trainer, read in one place.

The operator renders the variables on every worker and spare container (docs/architecture.md,
"Environment contract"); their names live in ``rtj_contract.env``, which both sides import, with the few
rtj-launch sets for the ranks here. Everything else in ``rtj_trainer`` takes a ``JobSettings`` instead
of reading ``os.environ`` itself, so tests can build one from a plain dict. ``JobSettings`` is public
too (``rtj_trainer.JobSettings``, docs/library.md): a script of one's own reads the job's settings from
it, as ``rtj-train`` does; the project's own modules know it by its older name, ``TrainerEnv``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from rtj_contract import progress as progress_contract
from rtj_contract.env import (
    CHECKPOINT_DIR,
    CHECKPOINT_INTERVAL_STEPS,
    CHECKPOINT_KEEP,
    CHECKPOINT_MODE,
    FAULTS,
    FT_CONFIG,
    FT_CONFIG_FILE,
    FT_HEARTBEAT_TIMEOUT_SECONDS,
    FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS,
    FT_MONITOR_INTERVAL_SECONDS,
    INPROCESS_BARRIER_TIMEOUT_SECONDS,
    INPROCESS_ENABLED,
    INPROCESS_HARD_TIMEOUT_SECONDS,
    INPROCESS_MAX_ITERATIONS,
    INPROCESS_SOFT_TIMEOUT_SECONDS,
    JOB_NAME,
    JOB_UID,
    LAUNCH_MODE,
    LAUNCH_MODE_SUPERVISOR,
    MAX_RESTARTS,
    MEMORY_INTERVAL_STEPS,
    MODE_ASYNC,
    MODE_SYNC,
    NAMESPACE,
    NNODES,
    NNODES_MAX,
    NODE_NAME,
    NODE_RANK,
    NPROC_PER_NODE,
    POD_IP,
    POD_NAME,
    PROGRESS_INTERVAL_SECONDS,
    PROGRESS_LINGER_SECONDS,
    PROGRESS_PORT,
    PROGRESS_SINK,
    RDZV_HOST,
    RDZV_PORT,
    ROLE,
    ROLE_SPARE,
    ROLE_WORKER,
    SLOT,
    SLOTS,
    STEP_LOG_PATTERN,
    STORE_HOST,
    STORE_PORT,
)

# Set by rtj-launch for each rank in supervisor mode: the number of active ranks of the world.
ACTIVE_WORLD_SIZE: Final = "RTJ_ACTIVE_WORLD_SIZE"
# Not rendered: where rtj-train's ranks find in-process restart's store and the process groups' store
# (it outlives the in-process iterations). Set by rtj-launch in supervisor mode (the store pod's);
# unset (0), rank 0 hosts them on the two ports after MASTER_PORT. Set by hand where the ranks share a
# host's ports with other programs (tests on loopback), which may take those.
WRAPPER_STORE_PORT: Final = "RTJ_WRAPPER_STORE_PORT"
GROUPS_STORE_PORT: Final = "RTJ_GROUPS_STORE_PORT"


class EnvError(ValueError):
    """A contract variable is missing or malformed."""


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise EnvError(f"{name} is required")
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise EnvError(f"{name}={raw!r} is not an integer") from err


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as err:
        raise EnvError(f"{name}={raw!r} is not a number") from err


def _bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise EnvError(f"{name}={raw!r} is not true/false")


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """The contract's values with the operator's defaults (docs/architecture.md, spec defaults).

    Public as ``rtj_trainer.JobSettings``: read-only (frozen), built by ``from_environ``.
    """

    job_name: str = "local"
    namespace: str = "default"
    job_uid: str = "local"
    pod_name: str = ""
    node_name: str = ""
    pod_ip: str = ""
    role: str = ROLE_WORKER
    node_rank: int = 0
    nnodes: int = 1
    nnodes_max: int = 1
    nproc_per_node: int = 1
    rdzv_host: str = "127.0.0.1"
    rdzv_port: int = 29500
    checkpoint_dir: str = "/checkpoints/local"
    checkpoint_interval_steps: int = 100
    checkpoint_keep: int = 3
    checkpoint_mode: str = MODE_ASYNC
    ft_heartbeat_timeout_seconds: float = 300.0
    ft_initial_heartbeat_timeout_seconds: float = 600.0
    ft_monitor_interval_seconds: float = 5.0
    max_restarts: int = 20
    inprocess_enabled: bool = True
    inprocess_max_iterations: int = 10
    inprocess_soft_timeout_seconds: float = 60.0
    inprocess_hard_timeout_seconds: float = 90.0
    inprocess_barrier_timeout_seconds: float = 120.0
    progress_sink: str = "endpoint"
    progress_interval_seconds: float = 5.0
    # The pod's progress endpoint (rtj_trainer.runtime.endpoint); 0 serves none.
    progress_port: int = progress_contract.PORT
    progress_linger_seconds: float = 15.0
    faults: str = ""
    launch_mode: str = ""
    slot: int = 0
    slots: int = 1
    store_host: str = ""
    store_port: int = 29500
    # 0: on rank 0, after MASTER_PORT (WRAPPER_STORE_PORT above).
    wrapper_store_port: int = 0
    groups_store_port: int = 0
    memory_interval_steps: int = 1
    # Empty: no pattern (steps are reported by the library, or not at all).
    step_log_pattern: str = ""
    # At most one of the two (the spec's fields are mutually exclusive); empty: none.
    ft_config: str = ""
    ft_config_file: str = ""
    # Supervisor mode (set by rtj-launch per rank): the world's active ranks, the reserve ranks
    # past them; 0 elsewhere (every rank of WORLD_SIZE is active).
    active_world_size: int = 0

    @property
    def supervisor_mode(self) -> bool:
        """Ranks in one fixed world with reserve ranks, stores in the store pod (no ft_launcher)."""
        return self.launch_mode == LAUNCH_MODE_SUPERVISOR

    @property
    def standby_spares(self) -> bool:
        """Under ft_launcher, whether the hot spares wait in the rendezvous as standby nodes: its
        most nodes are more than its active ones (rendezvous.spares Standby)."""
        return not self.supervisor_mode and self.nnodes_max > self.nnodes

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> JobSettings:
        d = cls()
        role = environ.get(ROLE, d.role) or d.role
        if role not in (ROLE_WORKER, ROLE_SPARE):
            raise EnvError(f"{ROLE}={role!r} must be {ROLE_WORKER!r} or {ROLE_SPARE!r}")
        mode = environ.get(CHECKPOINT_MODE, d.checkpoint_mode) or d.checkpoint_mode
        if mode not in (MODE_ASYNC, MODE_SYNC):
            raise EnvError(f"{CHECKPOINT_MODE}={mode!r} must be {MODE_ASYNC!r} or {MODE_SYNC!r}")
        nnodes = _int(environ, NNODES, d.nnodes)
        nnodes_max = max(_int(environ, NNODES_MAX, nnodes), nnodes)
        env = cls(
            job_name=environ.get(JOB_NAME, d.job_name),
            namespace=environ.get(NAMESPACE, d.namespace),
            job_uid=environ.get(JOB_UID, d.job_uid),
            pod_name=environ.get(POD_NAME, d.pod_name),
            node_name=environ.get(NODE_NAME, d.node_name),
            pod_ip=environ.get(POD_IP, d.pod_ip),
            role=role,
            node_rank=_int(environ, NODE_RANK, d.node_rank),
            nnodes=nnodes,
            nnodes_max=nnodes_max,
            nproc_per_node=_int(environ, NPROC_PER_NODE, d.nproc_per_node),
            rdzv_host=environ.get(RDZV_HOST, d.rdzv_host),
            rdzv_port=_int(environ, RDZV_PORT, d.rdzv_port),
            checkpoint_dir=environ.get(CHECKPOINT_DIR, d.checkpoint_dir),
            checkpoint_interval_steps=_int(environ, CHECKPOINT_INTERVAL_STEPS, d.checkpoint_interval_steps),
            checkpoint_keep=_int(environ, CHECKPOINT_KEEP, d.checkpoint_keep),
            checkpoint_mode=mode,
            ft_heartbeat_timeout_seconds=_float(
                environ, FT_HEARTBEAT_TIMEOUT_SECONDS, d.ft_heartbeat_timeout_seconds
            ),
            ft_initial_heartbeat_timeout_seconds=_float(
                environ, FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS, d.ft_initial_heartbeat_timeout_seconds
            ),
            ft_monitor_interval_seconds=_float(
                environ, FT_MONITOR_INTERVAL_SECONDS, d.ft_monitor_interval_seconds
            ),
            max_restarts=_int(environ, MAX_RESTARTS, d.max_restarts),
            inprocess_enabled=_bool(environ, INPROCESS_ENABLED, d.inprocess_enabled),
            inprocess_max_iterations=_int(environ, INPROCESS_MAX_ITERATIONS, d.inprocess_max_iterations),
            inprocess_soft_timeout_seconds=_float(
                environ, INPROCESS_SOFT_TIMEOUT_SECONDS, d.inprocess_soft_timeout_seconds
            ),
            inprocess_hard_timeout_seconds=_float(
                environ, INPROCESS_HARD_TIMEOUT_SECONDS, d.inprocess_hard_timeout_seconds
            ),
            inprocess_barrier_timeout_seconds=_float(
                environ, INPROCESS_BARRIER_TIMEOUT_SECONDS, d.inprocess_barrier_timeout_seconds
            ),
            progress_sink=environ.get(PROGRESS_SINK, d.progress_sink) or d.progress_sink,
            progress_interval_seconds=_float(environ, PROGRESS_INTERVAL_SECONDS, d.progress_interval_seconds),
            progress_port=_int(environ, PROGRESS_PORT, d.progress_port),
            progress_linger_seconds=_float(environ, PROGRESS_LINGER_SECONDS, d.progress_linger_seconds),
            faults=environ.get(FAULTS, d.faults),
            launch_mode=environ.get(LAUNCH_MODE, d.launch_mode),
            slot=_int(environ, SLOT, _int(environ, NODE_RANK, d.node_rank)),
            # Every pod that takes part: the workers, and spares standing by in the rendezvous.
            slots=_int(environ, SLOTS, nnodes_max),
            store_host=environ.get(STORE_HOST, d.store_host),
            store_port=_int(environ, STORE_PORT, d.store_port),
            wrapper_store_port=_int(environ, WRAPPER_STORE_PORT, d.wrapper_store_port),
            groups_store_port=_int(environ, GROUPS_STORE_PORT, d.groups_store_port),
            memory_interval_steps=_int(environ, MEMORY_INTERVAL_STEPS, d.memory_interval_steps),
            step_log_pattern=environ.get(STEP_LOG_PATTERN, d.step_log_pattern),
            ft_config=environ.get(FT_CONFIG, d.ft_config),
            ft_config_file=environ.get(FT_CONFIG_FILE, d.ft_config_file),
            active_world_size=_int(environ, ACTIVE_WORLD_SIZE, d.active_world_size),
        )
        env._check()
        return env

    def _check(self) -> None:
        """EnvError naming the variable when the settings cannot work together."""
        if not 0 <= self.progress_port <= 65535:
            raise EnvError(f"{PROGRESS_PORT}={self.progress_port} must be a port number (0: none)")
        for name, port in (
            (WRAPPER_STORE_PORT, self.wrapper_store_port),
            (GROUPS_STORE_PORT, self.groups_store_port),
        ):
            if not 0 <= port <= 65535:
                raise EnvError(f"{name}={port} must be a port number (0: on rank 0, after MASTER_PORT)")
        if self.checkpoint_interval_steps < 1 or self.checkpoint_keep < 1:
            raise EnvError(f"{CHECKPOINT_INTERVAL_STEPS} and {CHECKPOINT_KEEP} must be >= 1")
        if self.supervisor_mode and not self.store_host:
            raise EnvError(
                f"{LAUNCH_MODE}={LAUNCH_MODE_SUPERVISOR} needs {STORE_HOST} (the store pod's name)"
            )
        if not 0 <= self.slot < max(self.slots, 1) or self.slots < self.nnodes:
            raise EnvError(
                f"{SLOT}={self.slot} must be below {SLOTS}={self.slots}, which is at least {NNODES}"
            )
        if self.memory_interval_steps < 0:
            raise EnvError(f"{MEMORY_INTERVAL_STEPS}={self.memory_interval_steps} must be >= 0 (0: off)")
        if self.ft_config and self.ft_config_file:
            raise EnvError(f"{FT_CONFIG} and {FT_CONFIG_FILE} are exclusive: set one")


# The name the project's modules and tests use (the pod runtime's among them).
TrainerEnv = JobSettings
