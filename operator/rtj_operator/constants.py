"""Names shared by the renderer, the operator, the trainer and the tests.

Every label, annotation, finalizer and environment variable that crosses a component boundary is
defined here once. The trainer (a separate image) keeps its own copy of the environment names in
``rtj_trainer.env``; a test keeps the two in step.
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
LABEL_ROLE: Final = f"{GROUP}/role"  # "worker" or "spare" on pods
LABEL_WORKER_INDEX: Final = f"{GROUP}/worker-index"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "rtj-operator"
LABEL_APP_NAME: Final = "app.kubernetes.io/name"
APP_NAME: Final = "resilient-training-job"

ROLE_WORKER: Final = "worker"
ROLE_SPARE: Final = "spare"

# Annotations.
ANNOTATION_PROGRESS: Final = f"{GROUP}/progress"  # JSON written by the trainer on its own pod
ANNOTATION_REPLACES: Final = f"{GROUP}/replaces"  # on a replacement pod: the node it replaced
# On every worker pod the operator creates after a fault: status.restarts.podReplacement at the decision;
# the operator spaces replacements (failurePolicy.backoffSeconds) by the newest such pod's creation time.
ANNOTATION_RESTART_COUNT: Final = f"{GROUP}/restart-count"
FINALIZER: Final = f"{GROUP}/finalizer"

# Taint the operator puts on a node it excluded, when the job opts into cluster-wide tainting.
TAINT_EXCLUDED: Final = f"{GROUP}/excluded"

# The instance-type label the renderer's node affinity keys on.
LABEL_INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"
