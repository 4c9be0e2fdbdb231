"""The environment contract between the operator and the pod runtime: the variables the operator
renders on every worker, spare and store container (docs/architecture.md, "Environment contract"),
those a user sets through ``spec.env``, and the values some of them take.

The operator renders them (``rtj_operator.render``); the trainer reads them in one place
(``rtj_trainer.JobSettings``).
"""

from __future__ import annotations

from typing import Final

JOB_NAME: Final = "RTJ_JOB_NAME"
NAMESPACE: Final = "RTJ_NAMESPACE"
JOB_UID: Final = "RTJ_JOB_UID"
POD_NAME: Final = "RTJ_POD_NAME"
NODE_NAME: Final = "RTJ_NODE_NAME"
POD_IP: Final = "RTJ_POD_IP"
# The node's zone (topology.kubernetes.io/zone), through the downward API: the API server copies the
# node's topology labels onto the pod at binding (Kubernetes 1.35 on; empty where it does not).
NODE_ZONE: Final = "RTJ_NODE_ZONE"
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

# Every name the operator renders (some only when a field is set or under one launcher).
CONTRACT_NAMES: Final = (
    JOB_NAME,
    NAMESPACE,
    JOB_UID,
    POD_NAME,
    NODE_NAME,
    POD_IP,
    NODE_ZONE,
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
