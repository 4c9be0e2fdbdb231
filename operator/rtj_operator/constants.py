"""Names shared by the renderer, the operator, the trainer and the tests.

Every label, annotation, finalizer and environment variable that crosses a component boundary is
defined here once. The trainer (a separate image) keeps its own copy of the environment names in
``rtj_trainer.library.env``; a test keeps the two in step.
"""

from typing import Final

GROUP: Final = "resilient.training"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ResilientTrainingJob"
PLURAL: Final = "resilienttrainingjobs"
SINGULAR: Final = "resilienttrainingjob"
SHORT_NAMES: Final = ("rtj",)
CATEGORIES: Final = ("resilient-training",)

# Labels on every child object.
LABEL_JOB: Final = f"{GROUP}/job-name"
LABEL_ROLE: Final = f"{GROUP}/role"  # "worker", "spare" or "store" on pods
LABEL_WORKER_INDEX: Final = f"{GROUP}/worker-index"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "rtj-operator"
LABEL_APP_NAME: Final = "app.kubernetes.io/name"
APP_NAME: Final = "resilient-training-job"

ROLE_WORKER: Final = "worker"
ROLE_SPARE: Final = "spare"
# The store pod of a job under faultTolerance.launcher Supervisor: it serves the world's TCP stores.
ROLE_STORE: Final = "store"

# Annotations.
ANNOTATION_REPLACES: Final = f"{GROUP}/replaces"  # on a replacement pod: the node it replaced
# On every worker pod the operator creates after a fault: status.restarts.podReplacement at the decision;
# the operator spaces replacements (failurePolicy.backoffSeconds) by the newest such pod's creation time.
ANNOTATION_RESTART_COUNT: Final = f"{GROUP}/restart-count"
FINALIZER: Final = f"{GROUP}/finalizer"

# The port of each worker pod's progress endpoint (rtj-launch serves GET /progress and /metrics on it;
# the operator reads progress there). Rendered as the container port `progress` and RTJ_PROGRESS_PORT.
PROGRESS_PORT: Final = 9410
PROGRESS_PATH: Final = "/progress"

# Taint the operator puts on a node it excluded, when the job opts into cluster-wide tainting.
TAINT_EXCLUDED: Final = f"{GROUP}/excluded"

# The instance-type label the renderer's node affinity keys on.
LABEL_INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"
# The availability-zone label of nodes (and of zonal PersistentVolumes' node affinity).
LABEL_ZONE: Final = "topology.kubernetes.io/zone"

# Other projects' keys the renderer writes on opt-in (spec.disruption, spec.scheduling.gang).
ANNOTATION_DO_NOT_DISRUPT: Final = "karpenter.sh/do-not-disrupt"
LABEL_KUEUE_QUEUE: Final = "kueue.x-k8s.io/queue-name"
LABEL_KUEUE_POD_GROUP: Final = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_KUEUE_POD_GROUP_TOTAL: Final = "kueue.x-k8s.io/pod-group-total-count"
LABEL_COSCHEDULING_POD_GROUP: Final = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_API_VERSION: Final = "scheduling.x-k8s.io/v1alpha1"

# The user the trainer image runs as (Dockerfile): the pods' runAsUser/runAsGroup/fsGroup, and the
# owner the checkpoint-directory init container gives the job's directory.
TRAINER_UID: Final = 10001
TRAINER_GID: Final = 10001

# The environment contract (docs/architecture.md, "Environment contract"): the renderer sets these on
# every worker and spare container (RTJ_NODE_RANK on workers only, but for Supervisor; RTJ_FAULTS only
# through spec.env; ENV_SUPERVISOR_ONLY under faultTolerance.launcher Supervisor only, but for the store's
# address, also set under FtLauncher with rendezvous.host StorePod; ENV_WHEN_SET only when the spec
# sets the field they come from).
# rtj_trainer.library.env keeps the trainer's copy of the names; tests/api compares the two.
ENV_JOB_NAME: Final = "RTJ_JOB_NAME"
ENV_NAMESPACE: Final = "RTJ_NAMESPACE"
ENV_JOB_UID: Final = "RTJ_JOB_UID"
ENV_POD_NAME: Final = "RTJ_POD_NAME"
ENV_NODE_NAME: Final = "RTJ_NODE_NAME"
ENV_POD_IP: Final = "RTJ_POD_IP"
ENV_ROLE: Final = "RTJ_ROLE"
ENV_NODE_RANK: Final = "RTJ_NODE_RANK"
ENV_NNODES: Final = "RTJ_NNODES"
ENV_NNODES_MAX: Final = "RTJ_NNODES_MAX"
ENV_NPROC_PER_NODE: Final = "RTJ_NPROC_PER_NODE"
ENV_RDZV_HOST: Final = "RTJ_RDZV_HOST"
ENV_RDZV_PORT: Final = "RTJ_RDZV_PORT"
ENV_CHECKPOINT_DIR: Final = "RTJ_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL_STEPS: Final = "RTJ_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_KEEP: Final = "RTJ_CHECKPOINT_KEEP"
ENV_CHECKPOINT_MODE: Final = "RTJ_CHECKPOINT_MODE"
ENV_FT_HEARTBEAT_TIMEOUT_SECONDS: Final = "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS"
ENV_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS: Final = "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS"
ENV_FT_MONITOR_INTERVAL_SECONDS: Final = "RTJ_FT_MONITOR_INTERVAL_SECONDS"
ENV_MAX_RESTARTS: Final = "RTJ_MAX_RESTARTS"
ENV_INPROCESS_ENABLED: Final = "RTJ_INPROCESS_ENABLED"
ENV_INPROCESS_MAX_ITERATIONS: Final = "RTJ_INPROCESS_MAX_ITERATIONS"
ENV_INPROCESS_SOFT_TIMEOUT_SECONDS: Final = "RTJ_INPROCESS_SOFT_TIMEOUT_SECONDS"
ENV_INPROCESS_HARD_TIMEOUT_SECONDS: Final = "RTJ_INPROCESS_HARD_TIMEOUT_SECONDS"
ENV_INPROCESS_BARRIER_TIMEOUT_SECONDS: Final = "RTJ_INPROCESS_BARRIER_TIMEOUT_SECONDS"
ENV_PROGRESS_SINK: Final = "RTJ_PROGRESS_SINK"
ENV_PROGRESS_PORT: Final = "RTJ_PROGRESS_PORT"
ENV_FAULTS: Final = "RTJ_FAULTS"
# spec.progress.stepLogPattern: the Python regex rtj-launch matches each rank's output lines against.
ENV_STEP_LOG_PATTERN: Final = "RTJ_STEP_LOG_PATTERN"
# spec.faultTolerance.ftLauncher.config: ft_launcher's config file as YAML text (a fault_tolerance section).
ENV_FT_CONFIG: Final = "RTJ_FT_CONFIG"
# spec.faultTolerance.ftLauncher.configMap: the path of that file, mounted from the ConfigMap's key.
ENV_FT_CONFIG_FILE: Final = "RTJ_FT_CONFIG_FILE"
ENV_WHEN_SET: Final = (ENV_STEP_LOG_PATTERN, ENV_FT_CONFIG, ENV_FT_CONFIG_FILE)
# The worker container's terminationMessagePath: rtj-launch writes "Drained: ..." there after a drain.
ENV_TERMINATION_MESSAGE_PATH: Final = "RTJ_TERMINATION_MESSAGE_PATH"
# The exit code of a trainer whose ranks left because another pod of the job is draining (the drain
# protocol's EX_TEMPFAIL, rtj_trainer.library.drain; a test holds the two equal). ft_launcher restarts
# such workers in-job; a pod that fails with it (under the Supervisor launcher) left for a peer's drain.
PEER_DRAINED_EXIT_CODE: Final = 75
# A worker container's status when its launcher stopped the training for good: NVRx 0.7's ft_launcher
# when NVRx decided the job must not restart (its DEFAULT_NO_RESTART_EXIT_CODE), and rtj-launch after
# the same failure at the same step twice (rtj_trainer.runtime.launcher_view, a test keeps them equal).
NO_RESTART_EXIT_CODE: Final = 93
# Under faultTolerance.launcher Supervisor only (docs/architecture.md, "The Supervisor launcher"), on
# every worker and spare container: rtj-launch starts the pod's ranks itself in one fixed world whose
# slots are the workers (0..nodes-1) and then the spares (nodes..nodes+hotSpares-1); RTJ_NODE_RANK is
# the slot on both. RTJ_LAUNCH_MODE is otherwise unset (ft_launcher) or set by the user ("direct").
ENV_LAUNCH_MODE: Final = "RTJ_LAUNCH_MODE"
LAUNCH_MODE_SUPERVISOR: Final = "supervisor"
ENV_SLOT: Final = "RTJ_SLOT"
ENV_SLOTS: Final = "RTJ_SLOTS"
ENV_STORE_HOST: Final = "RTJ_STORE_HOST"
ENV_STORE_PORT: Final = "RTJ_STORE_PORT"
ENV_MEMORY_INTERVAL_STEPS: Final = "RTJ_MEMORY_INTERVAL_STEPS"
ENV_SUPERVISOR_ONLY: Final = (
    ENV_LAUNCH_MODE,
    ENV_SLOT,
    ENV_SLOTS,
    ENV_STORE_HOST,
    ENV_STORE_PORT,
    ENV_MEMORY_INTERVAL_STEPS,
)
# On the checkpoint-directory init container only: "<uid>:<gid>" to give RTJ_CHECKPOINT_DIR.
ENV_CHECKPOINT_DIR_OWNER: Final = "RTJ_CHECKPOINT_DIR_OWNER"
ENV_CONTRACT: Final = (
    ENV_JOB_NAME,
    ENV_NAMESPACE,
    ENV_JOB_UID,
    ENV_POD_NAME,
    ENV_NODE_NAME,
    ENV_POD_IP,
    ENV_ROLE,
    ENV_NODE_RANK,
    ENV_NNODES,
    ENV_NNODES_MAX,
    ENV_NPROC_PER_NODE,
    ENV_RDZV_HOST,
    ENV_RDZV_PORT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_INTERVAL_STEPS,
    ENV_CHECKPOINT_KEEP,
    ENV_CHECKPOINT_MODE,
    ENV_FT_HEARTBEAT_TIMEOUT_SECONDS,
    ENV_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS,
    ENV_FT_MONITOR_INTERVAL_SECONDS,
    ENV_MAX_RESTARTS,
    ENV_INPROCESS_ENABLED,
    ENV_INPROCESS_MAX_ITERATIONS,
    ENV_INPROCESS_SOFT_TIMEOUT_SECONDS,
    ENV_INPROCESS_HARD_TIMEOUT_SECONDS,
    ENV_INPROCESS_BARRIER_TIMEOUT_SECONDS,
    ENV_PROGRESS_SINK,
    ENV_PROGRESS_PORT,
    ENV_FAULTS,
    ENV_TERMINATION_MESSAGE_PATH,
    *ENV_WHEN_SET,
    *ENV_SUPERVISOR_ONLY,
)
