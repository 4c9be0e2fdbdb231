"""Names shared by the renderer, the operator, the trainer and the tests.

Every label, annotation, finalizer and environment variable that crosses a component boundary is
defined here once. The trainer (a separate image) keeps its own copy of the environment names in
``rtj_trainer.library.env``; a test keeps the two in step.
"""

from typing import Final

from rtj_contract import env as env_names

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
LABEL_ROLE: Final = f"{GROUP}/role"  # "worker", "spare", "surge" or "store" on pods
LABEL_WORKER_INDEX: Final = f"{GROUP}/worker-index"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "rtj-operator"
LABEL_APP_NAME: Final = "app.kubernetes.io/name"
APP_NAME: Final = "resilient-training-job"

ROLE_WORKER: Final = "worker"
ROLE_SPARE: Final = "spare"
# The store pod of a job under faultTolerance.launcher Supervisor: it serves the world's TCP stores.
ROLE_STORE: Final = "store"
# A surge pod: asks for a node for worker i's replacement while its old pod still checkpoints after a
# graceful delete (a drain), and gives that node to the replacement (rtj_operator.decide.surges). Its
# trainer container runs as a spare outside the training does (env RTJ_ROLE "spare": it holds the node).
ROLE_SURGE: Final = "surge"

# Annotations.
ANNOTATION_REPLACES: Final = f"{GROUP}/replaces"  # on a replacement pod: the node it replaced
# On every worker pod the operator creates after a fault: status.restarts.podReplacement at the decision;
# the operator spaces replacements (failurePolicy.backoffSeconds) by the newest such pod's creation time.
ANNOTATION_RESTART_COUNT: Final = f"{GROUP}/restart-count"
FINALIZER: Final = f"{GROUP}/finalizer"


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

# The environment contract (docs/architecture.md, "Environment contract"): its names are
# rtj_contract.env's, which the trainer reads too. The renderer sets them on every worker and spare
# container (RTJ_NODE_RANK on workers only, but for Supervisor; RTJ_FAULTS only through spec.env;
# ENV_SUPERVISOR_ONLY under faultTolerance.launcher Supervisor only, but for the store's address, also
# set under FtLauncher with rendezvous.host StorePod; ENV_WHEN_SET only when the spec sets the field
# they come from: spec.progress.stepLogPattern, spec.faultTolerance.ftLauncher.config and .configMap).
ENV_WHEN_SET: Final = (env_names.STEP_LOG_PATTERN, env_names.FT_CONFIG, env_names.FT_CONFIG_FILE)
# Under faultTolerance.launcher Supervisor only (docs/architecture.md, "The Supervisor launcher"), on
# every worker and spare container: rtj-launch starts the pod's ranks itself in one fixed world whose
# slots are the workers (0..nodes-1) and then the spares (nodes..nodes+hotSpares-1); RTJ_NODE_RANK is
# the slot on both. RTJ_LAUNCH_MODE is otherwise unset (ft_launcher) or set by the user ("direct").
ENV_SUPERVISOR_ONLY: Final = (
    env_names.LAUNCH_MODE,
    env_names.SLOT,
    env_names.SLOTS,
    env_names.STORE_HOST,
    env_names.STORE_PORT,
    env_names.MEMORY_INTERVAL_STEPS,
)
