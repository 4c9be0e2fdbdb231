"""Event reasons of the operator, defined once (condition types and their own reasons are in
`rtj_operator.decide.conditions`).

`decide` chooses which Events to emit and which conditions to set; `runtime.job_pass` posts them; the
docs (docs/operations.md) and the tests refer to these names. Reasons are unique, specific CamelCase
words, following the Kubernetes API conventions. The job and entry states (status.state,
status.workers.pods[].state) are `api.JobState` and `api.EntryState`, shared with the schema.
"""

from __future__ import annotations

from typing import Final

from rtj_contract import termination

# Event types (core/v1 Event.type).
NORMAL: Final = "Normal"
WARNING: Final = "Warning"

# Event reasons.
CHILDREN_CREATED: Final = "ChildrenCreated"  # the job's Service, storage, RBAC and workers were created
NODE_LOST: Final = "NodeLost"  # a node running a worker became NotReady/unreachable, tainted or deleted
# A worker pod was evicted, preempted or deleted by others, or left after another pod's drain.
WORKER_DISRUPTED: Final = "WorkerDisrupted"
WORKER_FAILED: Final = "WorkerFailed"  # a worker pod exited non-zero on a healthy node
WORKER_REPLACED: Final = "WorkerReplaced"  # a replacement worker pod was created
SPARE_USED: Final = "SpareUsed"  # a hot spare was given up so that a replacement can use its node
# A worker pod is terminating gracefully on a node that is not lost (a drain) and no hot spare can take its
# place: a surge pod asks for its replacement's node meanwhile (rtj_operator.decide.surges).
SURGE_CREATED: Final = "SurgeCreated"
SURGE_USED: Final = "SurgeUsed"  # a replacement was pinned to the node a surge pod held (then deleted)
# The API server refused a surge pod (a quota, a policy): the replacement asks for its node once the
# old pod is gone, as without surges; nothing is blocked.
SURGE_REFUSED: Final = "SurgeRefused"
# A worker was moved off a node that will go soon (a spot interruption notice): checkpoint at SIGTERM,
# then a replacement elsewhere.
WORKER_MOVED: Final = "WorkerMoved"
GANG_RESTART: Final = "GangRestart"  # every worker pod is recreated (rendezvous host lost or job failed)
# The store pod of a Supervisor job failed, was disrupted or deleted, or its node was lost: the world
# is broken, every pod and the store are recreated (a GangRestart follows).
STORE_LOST: Final = "StoreLost"
NODE_EXCLUDED: Final = "NodeExcluded"  # a node will not be used by this job again
NODE_TAINTED: Final = "NodeTainted"  # an excluded node was tainted cluster-wide (opt-in)
STRANDED_POD_DELETED: Final = "StrandedPodDeleted"  # a pod on a dead node was force-deleted
RESTART_BUDGET_EXHAUSTED: Final = "RestartBudgetExhausted"  # maxNodeReplacements or a budget reached: Failed
FAILED_BY_RULE: Final = "FailedByRule"  # a failurePolicy rule with action FailJob matched a fault: job Failed
# A worker's training command cannot start: rtj-launch said so (its termination message's line
# `FaultReason: StartupFailed`, also this word), or the worker's pods failed the same way before any
# step STARTUP_FAILURES_TO_FAIL times in a row. The job is Failed at once, spending no budget.
STARTUP_FAILED: Final = termination.STARTUP_FAILED
# A worker's training fails the same way after the same step on every try: rtj-launch said so (the
# line `FaultReason: DeterministicFailure`, also this word), or NVRx's launcher exited with its
# no-restart status (rtj_contract.termination.NO_RESTART_EXIT_CODE). The job is Failed at once,
# spending no budget.
DETERMINISTIC_FAILURE: Final = termination.DETERMINISTIC_FAILURE
FAULT_IGNORED: Final = (
    "FaultIgnored"  # a failurePolicy Ignore rule matched: replaced, counted against nothing
)
JOB_SUCCEEDED: Final = "JobSucceeded"  # every worker pod succeeded
# Every worker is ready again after a recovery and training advanced past the step it resumed from
# (for a trainer that never reported progress: every worker is ready again).
JOB_RECOVERED: Final = "JobRecovered"
TRAINING_STALLED: Final = "TrainingStalled"  # every worker ready, no step for spec.progress.stallAfterSeconds
TRAINING_RESUMED: Final = "TrainingResumed"  # a stalled job's training step advanced again
# The job sets fields only the rtj library honours, and its workers report no library (once).
SETTINGS_IGNORED: Final = "SettingsIgnored"
INVALID_SPEC: Final = "InvalidSpec"  # the job's spec does not validate; nothing is done for it
SUSPENDED: Final = "Suspended"  # spec.suspend became true: workers and spares deleted
RESUMED: Final = "Resumed"  # spec.suspend became false: workers recreated
TTL_EXPIRED: Final = "TTLExpired"  # ttlSecondsAfterFinished passed: the job is deleted
STORAGE_DELETED: Final = "StorageDeleted"  # retentionPolicy Delete: the checkpoint volume was deleted
# The API server refused a child (400/403/404/422): invalid, a policy, a kind it does not serve.
CHILD_REJECTED: Final = "ChildRejected"
QUOTA_EXCEEDED: Final = "QuotaExceeded"  # a ResourceQuota of the namespace refused a child
FILE_SYSTEM_NOT_ALLOWED: Final = "FileSystemNotAllowed"  # fsxStatic names a file system not allowed there
INSUFFICIENT_NODES: Final = "InsufficientNodes"  # too few nodes can ever hold a worker: no pod created
STATUS_OVERWRITTEN: Final = "StatusOverwritten"  # someone else wrote the job's status: restored
