"""Event reasons and condition vocabulary of the operator, defined once.

`decide` chooses which Events to emit and which conditions to set; `runtime.passes` posts them; the
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

# Condition types (status.conditions[].type).
COND_READY: Final = "Ready"
COND_RECOVERING: Final = "Recovering"
COND_SUSPENDED: Final = "Suspended"
COND_SUCCEEDED: Final = "Succeeded"
COND_FAILED: Final = "Failed"
# True while the job cannot get its children: the API server refused one (ChildRejected,
# QuotaExceeded), too few nodes could ever hold its workers (InsufficientNodes), or its FSx file
# system is not allowed for its namespace (FileSystemNotAllowed).
COND_BLOCKED: Final = "Blocked"
# True while every worker is ready but the training step has not advanced for
# spec.progress.stallAfterSeconds (decide.training).
# Unknown (StepsNotReported) while no worker reports a step: a stall cannot be told.
COND_STALLED: Final = "Stalled"
# True while the spec sets fields only the rtj library honours (api.spec.LIBRARY_ONLY_FIELDS) and the
# workers report no library: a training script of one's own ignores them (decide.library).
COND_SETTINGS_IGNORED: Final = "SettingsIgnored"
# True while a worker's node is being taken out (a cordon, a maintenance taint) and the job's own
# PodDisruptionBudget refuses the worker's eviction: the drain waits for the job (decide.drains).
COND_DRAIN_WAITING: Final = "DrainWaiting"
CONDITION_TYPES: Final = (
    COND_READY,
    COND_RECOVERING,
    COND_STALLED,
    COND_SUSPENDED,
    COND_SUCCEEDED,
    COND_FAILED,
    COND_BLOCKED,
    COND_SETTINGS_IGNORED,
    COND_DRAIN_WAITING,
)
# The Blocked reasons that come from a refused create (retried on a spec change or a slow recheck).
REFUSAL_REASONS: Final = frozenset({CHILD_REJECTED, QUOTA_EXCEEDED})

# Condition reasons that are not also event reasons.
REASON_ALL_WORKERS_READY: Final = "AllWorkersReady"
REASON_WORKERS_NOT_READY: Final = "WorkersNotReady"
REASON_RECOVERING: Final = "Recovering"
REASON_NO_FAULT: Final = "NoFault"
REASON_NOT_SUSPENDED: Final = "NotSuspended"
REASON_RUNNING: Final = "Running"
REASON_FINISHED: Final = "Finished"
REASON_NOT_BLOCKED: Final = "NotBlocked"
REASON_POD_DISRUPTION_BUDGET: Final = "PodDisruptionBudget"  # DrainWaiting=True: the job's budget holds it
REASON_NO_DRAIN_WAITING: Final = "NoDrainWaiting"
REASON_NO_PROGRESS: Final = "NoProgress"  # Stalled=True: the step has not advanced
REASON_NOT_STALLED: Final = "NotStalled"  # Stalled=False before any stall
# Stalled=Unknown: no worker reports a training step (neither the rtj library nor stepLogPattern).
REASON_STEPS_NOT_REPORTED: Final = "StepsNotReported"
# lastRecovery.reason of an in-job restart that rtj-launch timed (a job whose restarts source is Launcher).
REASON_IN_JOB_RESTART: Final = "InJobRestart"
REASON_LIBRARY_NOT_IN_USE: Final = "LibraryNotInUse"  # SettingsIgnored=True: the fields it lists are ignored
REASON_LIBRARY_IN_USE: Final = "LibraryInUse"  # SettingsIgnored=False: the workers report through the library
REASON_NO_LIBRARY_SETTINGS: Final = "NoLibrarySettings"  # SettingsIgnored=False: no library-only field is set
