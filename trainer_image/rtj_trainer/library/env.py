"""The environment contract between the operator and the trainer, read in one place.

The operator renders these variables on every worker and spare container (docs/architecture.md,
"Environment contract"); ``rtj_operator.constants`` keeps the operator's copy of the names and a test
keeps the two in step. Everything else in ``rtj_trainer`` takes a ``JobSettings`` instead of reading
``os.environ`` itself, so tests can build one from a plain dict. ``JobSettings`` is public too
(``rtj_trainer.JobSettings``, docs/library.md): a script of one's own reads the job's settings from it,
as ``rtj-train`` does; the project's own modules know it by its older name, ``TrainerEnv``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

JOB_NAME: Final = "RTJ_JOB_NAME"
NAMESPACE: Final = "RTJ_NAMESPACE"
JOB_UID: Final = "RTJ_JOB_UID"
POD_NAME: Final = "RTJ_POD_NAME"
NODE_NAME: Final = "RTJ_NODE_NAME"
POD_IP: Final = "RTJ_POD_IP"
ROLE: Final = "RTJ_ROLE"
NODE_RANK: Final = "RTJ_NODE_RANK"
NNODES: Final = "RTJ_NNODES"
NNODES_MAX: Final = "RTJ_NNODES_MAX"
NPROC_PER_NODE: Final = "RTJ_NPROC_PER_NODE"
RDZV_HOST: Final = "RTJ_RDZV_HOST"
RDZV_PORT: Final = "RTJ_RDZV_PORT"
CHECKPOINT_DIR: Final = "RTJ_CHECKPOINT_DIR"
CHECKPOINT_INTERVAL_STEPS: Final = "RTJ_CHECKPOINT_INTERVAL_STEPS"
CHECKPOINT_KEEP: Final = "RTJ_CHECKPOINT_KEEP"
CHECKPOINT_MODE: Final = "RTJ_CHECKPOINT_MODE"
FT_HEARTBEAT_TIMEOUT_SECONDS: Final = "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS"
FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS: Final = "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS"
FT_MONITOR_INTERVAL_SECONDS: Final = "RTJ_FT_MONITOR_INTERVAL_SECONDS"
MAX_RESTARTS: Final = "RTJ_MAX_RESTARTS"
INPROCESS_ENABLED: Final = "RTJ_INPROCESS_ENABLED"
INPROCESS_MAX_ITERATIONS: Final = "RTJ_INPROCESS_MAX_ITERATIONS"
INPROCESS_SOFT_TIMEOUT_SECONDS: Final = "RTJ_INPROCESS_SOFT_TIMEOUT_SECONDS"
INPROCESS_HARD_TIMEOUT_SECONDS: Final = "RTJ_INPROCESS_HARD_TIMEOUT_SECONDS"
INPROCESS_BARRIER_TIMEOUT_SECONDS: Final = "RTJ_INPROCESS_BARRIER_TIMEOUT_SECONDS"
PROGRESS_SINK: Final = "RTJ_PROGRESS_SINK"
PROGRESS_INTERVAL_SECONDS: Final = "RTJ_PROGRESS_INTERVAL_SECONDS"
PROGRESS_PORT: Final = "RTJ_PROGRESS_PORT"
# User-set (spec.env), not rendered: how long rtj-launch keeps a finished pod's endpoint up for the
# operator to read the final report.
PROGRESS_LINGER_SECONDS: Final = "RTJ_PROGRESS_LINGER_SECONDS"
FAULTS: Final = "RTJ_FAULTS"
# Rendered only when the spec sets the field they come from. spec.progress.stepLogPattern: the Python
# regex each rank's output lines are searched for. The rank shim (rtj_trainer.runtime.rankshim) reads
# it, with its own copy of the name (it imports nothing of rtj_trainer; a test keeps the two equal),
# and rtj-launch checks it before anything starts (rtj_trainer.runtime.launch.check_step_log_pattern).
STEP_LOG_PATTERN: Final = "RTJ_STEP_LOG_PATTERN"
# spec.faultTolerance.ftLauncher.config: ft_launcher's config file as YAML text; rtj-launch writes it
# to a file and passes ft_launcher its config-path flag.
FT_CONFIG: Final = "RTJ_FT_CONFIG"
# spec.faultTolerance.ftLauncher.configMap: the path of that file, mounted from a ConfigMap.
FT_CONFIG_FILE: Final = "RTJ_FT_CONFIG_FILE"
TERMINATION_MESSAGE_PATH: Final = "RTJ_TERMINATION_MESSAGE_PATH"
# Only on the checkpoint-directory init container (rtj-launch --prepare-checkpoint-dir): "<uid>:<gid>".
CHECKPOINT_DIR_OWNER: Final = "RTJ_CHECKPOINT_DIR_OWNER"
# User-set (spec.env), not rendered: "direct" makes rtj-launch exec the command without ft_launcher.
LAUNCH_MODE: Final = "RTJ_LAUNCH_MODE"
LAUNCH_MODE_DIRECT: Final = "direct"
# Rendered under faultTolerance.launcher Supervisor only (on workers and spares), with LAUNCH_MODE:
# rtj-launch starts the pod's ranks itself in one fixed world that holds the hot spares' reserve
# ranks, with its stores in the job's store pod (rtj_trainer.runtime.supervisor).
LAUNCH_MODE_SUPERVISOR: Final = "supervisor"
SLOT: Final = "RTJ_SLOT"
SLOTS: Final = "RTJ_SLOTS"
# The store pod's address: also rendered under ft_launcher when the store pod hosts the rendezvous
# (rendezvous.host StorePod); then no node's launcher hosts it (rtj_trainer.runtime.launch).
STORE_HOST: Final = "RTJ_STORE_HOST"
STORE_PORT: Final = "RTJ_STORE_PORT"
MEMORY_INTERVAL_STEPS: Final = "RTJ_MEMORY_INTERVAL_STEPS"
# Set by rtj-launch for each rank in supervisor mode: the number of active ranks of the world.
ACTIVE_WORLD_SIZE: Final = "RTJ_ACTIVE_WORLD_SIZE"
# Not rendered: where rtj-train's ranks find in-process restart's store and the process groups' store
# (it outlives the in-process iterations). Set by rtj-launch in supervisor mode (the store pod's);
# unset (0), rank 0 hosts them on the two ports after MASTER_PORT. Set by hand where the ranks share a
# host's ports with other programs (tests on loopback), which may take those.
WRAPPER_STORE_PORT: Final = "RTJ_WRAPPER_STORE_PORT"
GROUPS_STORE_PORT: Final = "RTJ_GROUPS_STORE_PORT"

# Every name of the contract, for the test that compares them with the operator's renderer.
CONTRACT_NAMES: Final = (
    JOB_NAME,
    NAMESPACE,
    JOB_UID,
    POD_NAME,
    NODE_NAME,
    POD_IP,
    ROLE,
    NODE_RANK,
    NNODES,
    NNODES_MAX,
    NPROC_PER_NODE,
    RDZV_HOST,
    RDZV_PORT,
    CHECKPOINT_DIR,
    CHECKPOINT_INTERVAL_STEPS,
    CHECKPOINT_KEEP,
    CHECKPOINT_MODE,
    FT_HEARTBEAT_TIMEOUT_SECONDS,
    FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS,
    FT_MONITOR_INTERVAL_SECONDS,
    MAX_RESTARTS,
    INPROCESS_ENABLED,
    INPROCESS_MAX_ITERATIONS,
    INPROCESS_SOFT_TIMEOUT_SECONDS,
    INPROCESS_HARD_TIMEOUT_SECONDS,
    INPROCESS_BARRIER_TIMEOUT_SECONDS,
    PROGRESS_SINK,
    PROGRESS_PORT,
    FAULTS,
    STEP_LOG_PATTERN,
    FT_CONFIG,
    FT_CONFIG_FILE,
    TERMINATION_MESSAGE_PATH,
    LAUNCH_MODE,
    SLOT,
    SLOTS,
    STORE_HOST,
    STORE_PORT,
    MEMORY_INTERVAL_STEPS,
)

ROLE_WORKER: Final = "worker"
ROLE_SPARE: Final = "spare"
MODE_ASYNC: Final = "Async"
MODE_SYNC: Final = "Sync"


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
    progress_port: int = 9410
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
    def supervised(self) -> bool:
        """Ranks in one fixed world with reserve ranks, stores in the store pod (no ft_launcher)."""
        return self.launch_mode == LAUNCH_MODE_SUPERVISOR

    @property
    def standby_spares(self) -> bool:
        """Under ft_launcher, whether the hot spares wait in the rendezvous as standby nodes: its
        most nodes are more than its active ones (rendezvous.spares Standby)."""
        return not self.supervised and self.nnodes_max > self.nnodes

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
        if not 0 <= env.progress_port <= 65535:
            raise EnvError(f"{PROGRESS_PORT}={env.progress_port} must be a port number (0: none)")
        for name, port in (
            (WRAPPER_STORE_PORT, env.wrapper_store_port),
            (GROUPS_STORE_PORT, env.groups_store_port),
        ):
            if not 0 <= port <= 65535:
                raise EnvError(f"{name}={port} must be a port number (0: on rank 0, after MASTER_PORT)")
        if env.checkpoint_interval_steps < 1 or env.checkpoint_keep < 1:
            raise EnvError(f"{CHECKPOINT_INTERVAL_STEPS} and {CHECKPOINT_KEEP} must be >= 1")
        if env.supervised and not env.store_host:
            raise EnvError(
                f"{LAUNCH_MODE}={LAUNCH_MODE_SUPERVISOR} needs {STORE_HOST} (the store pod's name)"
            )
        if not 0 <= env.slot < max(env.slots, 1) or env.slots < env.nnodes:
            raise EnvError(f"{SLOT}={env.slot} must be below {SLOTS}={env.slots}, which is at least {NNODES}")
        if env.memory_interval_steps < 0:
            raise EnvError(f"{MEMORY_INTERVAL_STEPS}={env.memory_interval_steps} must be >= 0 (0: off)")
        if env.ft_config and env.ft_config_file:
            raise EnvError(f"{FT_CONFIG} and {FT_CONFIG_FILE} are exclusive: set one")
        return env


# The name the project's modules and tests use (the pod runtime's among them).
TrainerEnv = JobSettings
