"""The status models of ResilientTrainingJob: what the operator observed, written through /status.

The models ignore unknown fields (other writers, such as kopf, may add theirs). The two state
vocabularies, `JobState` (status.state) and `EntryState` (status.workers.pods[].state), are defined here
once and used by the schema and by the operator's decisions (`rtj_operator.decide`) alike.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from rtj_operator.api.schema import INT32_MAX, DateTime, Int64, SchemaExtra, StatusModel

# A count or index the operator reports (bounded in the CRD too: the API server does not hold integers
# to their format).
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]


def _unset(value: object) -> bool:
    """Left out of the status when written (`StatusModel.to_status`): a count of 0, an empty text."""
    return not value


class JobState(enum.StrEnum):
    """status.state: the most significant true condition, for kubectl."""

    PENDING = "Pending"
    RUNNING = "Running"
    STALLED = "Stalled"
    RECOVERING = "Recovering"
    BLOCKED = "Blocked"  # Blocked=True: the job cannot get its pods (refused, too few nodes, FSx)
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class StepSource(enum.StrEnum):
    """Where the training step a worker reports comes from (the report's `sources.step`)."""

    LIBRARY = "Library"  # the rtj library's own report (rtj-train)
    LOG_PATTERN = "LogPattern"  # a line of the script's output matched spec.progress.stepLogPattern
    NOT_REPORTED = "NotReported"  # neither: the job's step is not known


class RestartsSource(enum.StrEnum):
    """Who counts the in-process and in-job restarts a worker reports (the report's `sources.restarts`)."""

    LIBRARY = "Library"  # the rtj library, which sees in-process and in-job restarts
    LAUNCHER = "Launcher"  # rtj-launch, from the ranks it saw start and end (in-job restarts only)


class EntryState(enum.StrEnum):
    """status.workers.pods[].state: the operator's record of one worker or spare.

    A fault is counted in the same status write that moves an entry to `Replacing`; see
    `rtj_operator.decide`.
    """

    CREATING = "Creating"  # a pod is wanted and none has been seen on a node yet
    PENDING = "Pending"  # the pod was seen on `nodeName`, not running yet
    RUNNING = "Running"  # the pod was seen running on `nodeName`
    SUCCEEDED = "Succeeded"  # the pod exited zero
    FAILED = "Failed"  # the job failed and the pod is gone
    REPLACING = "Replacing"  # a fault was counted: the old pod goes, a new one is created
    SUSPENDED = "Suspended"  # the job is suspended: no pod is wanted


# Entry states in which the pod was seen on `nodeName`: only there can a fault be counted.
OBSERVED_ON_NODE = frozenset({EntryState.PENDING, EntryState.RUNNING})


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="type is Ready, Recovering, Stalled, Suspended, Succeeded, Failed, Blocked or "
        "SettingsIgnored."
    )
    status: ConditionStatus = Field(description="status is True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="reason is a CamelCase word for the last transition."
    )
    message: str | None = Field(default=None, description="message is a sentence about the last transition.")
    last_transition_time: DateTime | None = Field(
        default=None, description="lastTransitionTime is when status last changed."
    )
    observed_generation: Int64 | None = Field(
        default=None, description="observedGeneration is the spec generation the condition was set for."
    )


class PodStatus(StatusModel):
    """One worker, spare, surge or store pod as the operator last saw it."""

    index: Count = Field(
        description="index is the worker or spare index (a surge pod's is its worker's; 0 for the store pod)."
    )
    role: str = Field(
        description="role is worker, spare, surge (a surge pod asking for a node for a worker's "
        "replacement while the old pod terminates, only while one is wanted) or store."
    )
    pod_name: str = Field(description="podName is the pod's name.")
    node_name: str = Field(default="", description="nodeName is the node the pod is bound to.")
    state: EntryState = Field(
        default=EntryState.CREATING,
        description="state is Creating, Pending, Running, Succeeded, Failed, Replacing or Suspended: the "
        "operator's record of the pod.",
    )
    start_failures: Count = Field(
        default=0,
        exclude_if=_unset,
        description="startFailures counts the consecutive pods of this worker that failed the same way "
        "(lastStartFailure) before any training step; at 3 the job fails (StartupFailed).",
    )
    last_start_failure: Annotated[str, Field(max_length=1024)] = Field(
        default="",
        exclude_if=_unset,
        description="lastStartFailure is the exit code and message those pods failed with.",
    )

    def reset(self, state: EntryState = EntryState.CREATING) -> None:
        """Forget the node: a new pod is wanted (or none, when suspended)."""
        self.state, self.node_name = state, ""

    @property
    def on_node(self) -> bool:
        """Seen Pending/Running on a recorded node: a fault of that pod is counted."""
        return self.state in OBSERVED_ON_NODE and bool(self.node_name)


class WorkersStatus(StatusModel):
    """Counts of the job's pods."""

    desired: Count = Field(default=0, description="desired is spec.nodes.")
    ready: Count = Field(default=0, description="ready is the number of ready worker pods.")
    ready_spares: Count = Field(default=0, description="readySpares is the number of ready spare pods.")
    ready_text: str | None = Field(default=None, description='readyText is "ready/desired", for kubectl.')
    pods: list[PodStatus] = Field(
        default_factory=list, description="pods are the job's worker and spare pods, and its surge pods."
    )


class RestartsStatus(StatusModel):
    """Restarts per recovery layer."""

    in_process: Count = Field(
        default=0, description="inProcess counts NVRx in-process restarts (max over pods)."
    )
    in_job: Count = Field(default=0, description="inJob counts ft_launcher worker restarts (max over pods).")
    pod_replacement: Count = Field(
        default=0, description="podReplacement counts worker pods the operator replaced."
    )
    total: Count = Field(default=0, description="total is the sum of the three.")

    def counted(self) -> RestartsStatus:
        """These counts with their total."""
        return self.model_copy(update={"total": self.in_process + self.in_job + self.pod_replacement})


class ExcludedNode(StatusModel):
    """A node the job no longer schedules onto."""

    node_name: str = Field(description="nodeName is the excluded node.")
    reason: str | None = Field(default=None, description="reason says why it was excluded.")
    time: DateTime | None = Field(default=None, description="time is when it was excluded.")


class NodeFault(StatusModel):
    """Faults the job saw on one node."""

    node_name: str = Field(description="nodeName is the node.")
    count: Count = Field(default=0, description="count is the number of faults seen on it.")
    last_reason: str | None = Field(default=None, description="lastReason is the newest fault's reason.")
    last_time: DateTime | None = Field(default=None, description="lastTime is the newest fault's time.")
    reported_faults: Count = Field(
        default=0,
        exclude_if=_unset,
        description=(
            "reportedFaults is the most faults a worker's trainer attributed to this node in its "
            "progress reports (CUDA errors, failed GPU health checks); past the operator's "
            "trainerFaultThreshold the node is treated as unhealthy."
        ),
    )


class RecentFault(StatusModel):
    """A fault counted against a windowed budget (spec.failurePolicy.budgets)."""

    fault_class: str = Field(description="faultClass is NodeLoss, ProcessFailure or Disruption.")
    time: DateTime = Field(description="time is when the fault was counted.")


class BudgetStatus(StatusModel):
    """What the failure policy has counted: budgets used and the backoff series."""

    failures_used: Count = Field(
        default=0,
        description="failuresUsed counts replacements charged to spec.failurePolicy.maxNodeReplacements.",
    )
    disruptions: Count = Field(
        default=0, description="disruptions counts replacements after evictions, preemptions and drains."
    )
    ignored: Count = Field(
        default=0, description="ignored counts replacements after faults an Ignore rule matched."
    )
    consecutive_faults: Count = Field(
        default=0,
        description="consecutiveFaults counts faults since the job was last Ready for "
        "backoffResetSeconds; the backoff doubles with each.",
    )
    recent_faults: Annotated[list[RecentFault], Field(max_length=300)] = Field(
        default_factory=list,
        description="recentFaults are the faults still inside their class's budget window, oldest first.",
    )


class CheckpointStatus(StatusModel):
    """The newest complete checkpoint."""

    step: Int64 | None = Field(default=None, description="step is the checkpoint's training step.")
    time: DateTime | None = Field(default=None, description="time is when it was committed.")


class ProgressSources(StatusModel):
    """Where the figures of status.progress and status.restarts come from."""

    step: StepSource | None = Field(
        default=None,
        description="step is Library (the rtj library reports it), LogPattern (matched in the script's "
        "output by spec.progress.stepLogPattern) or NotReported (no step is known: stalls are not judged).",
    )
    restarts: RestartsSource | None = Field(
        default=None,
        description="restarts is Library (the rtj library counts in-process and in-job restarts) or "
        "Launcher (rtj-launch counts the in-job restarts it saw).",
    )


class ProgressStatus(StatusModel):
    """Training progress folded from the pods' reports."""

    step: Int64 | None = Field(default=None, description="step is the newest training step any pod reported.")
    step_time_seconds: float | None = Field(
        default=None, description="stepTimeSeconds is the recent time per step."
    )
    goodput_percent: float | None = Field(
        default=None,
        description="goodputPercent is useful step time over wall time since training started, in percent.",
    )
    update_time: DateTime | None = Field(
        default=None, description="updateTime is when progress was last reported."
    )
    current_step: Int64 | None = Field(
        default=None,
        description="currentStep is the step the job's current workers have reached (the most advanced "
        "one's report); below step while a restarted job redoes the steps since the checkpoint it "
        "resumed from.",
    )
    last_advance_time: DateTime | None = Field(
        default=None,
        description="lastAdvanceTime is when the operator first saw currentStep increase: when training "
        "last completed a step.",
    )
    samples: Int64 | None = Field(
        default=None,
        description="samples is the number of samples the job trained on up to step, as the training "
        "script reports them through the rtj library (the global batch of each step); absent when it "
        "reports none.",
    )
    tokens: Int64 | None = Field(
        default=None,
        description="tokens is the number of tokens the job trained on up to step, as the training "
        "script reports them through the rtj library; absent when it reports none.",
    )
    samples_per_second: float | None = Field(
        default=None,
        description="samplesPerSecond is the job's recent throughput in samples per second of useful "
        "step time (time blocked by checkpoint saves left out), over the newest 30 s of it (less just "
        "after a start).",
    )
    tokens_per_second: float | None = Field(
        default=None,
        description="tokensPerSecond is the job's recent throughput in tokens per second of useful "
        "step time, measured as samplesPerSecond is.",
    )
    sources: ProgressSources | None = Field(
        default=None, description="sources says where the step and the restart counts come from."
    )
    library: Annotated[str, Field(max_length=64)] | None = Field(
        default=None,
        description="library is the version of the rtj library the workers report through; absent for a "
        "training script of one's own.",
    )


class NullsWritten(StatusModel):
    """A part of the status rewritten whole each time: every field is written, null when unknown.
    Status is written as a merge patch, in which only a null removes a field an earlier version had
    (a stale `message` beside a recommendation, an old `faultTime` beside a new recovery)."""

    @model_serializer(mode="wrap")
    def _nulls_kept(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        written: dict[str, Any] = handler(self)
        for name, field in type(self).model_fields.items():
            written.setdefault(field.alias if info.by_alias and field.alias else name, None)
        return written


class RecoveryStatus(NullsWritten):
    """The newest recovery from a fault, from the fault to the first step (or the ranks) after it."""

    reason: str | None = Field(
        default=None,
        description="reason is the fault's reason (NodeLost, WorkerFailed, WorkerDisrupted), or InJobRestart "
        "for an in-job restart that rtj-launch timed (a job whose restarts source is Launcher).",
    )
    fault_time: DateTime | None = Field(
        default=None, description="faultTime is when the operator counted the fault and began recovering."
    )
    resume_time: DateTime | None = Field(
        default=None,
        description="resumeTime is when training advanced again after the fault (every worker ready and "
        "the step advanced); for a job that reports no step, when the ranks of every worker were running "
        "again (or, with no report at all, when every worker was ready).",
    )
    duration_seconds: float | None = Field(
        default=None, description="durationSeconds is resumeTime - faultTime."
    )
    step: Int64 | None = Field(
        default=None, description="step is the step training had reached at resumeTime."
    )


class CheckpointAdviceStatus(NullsWritten):
    """The checkpoint interval the measured costs advise (Young/Daly), beside the configured one."""

    save_cost_seconds: float | None = Field(
        default=None,
        description="saveCostSeconds is how long the newest checkpoint save blocked training (the most "
        "of any worker's report): what one checkpoint costs the job. Async saves block little.",
    )
    faults: Count | None = Field(
        default=None, description="faults is the number of faults counted: status.restarts.total."
    )
    mean_time_between_faults_seconds: float | None = Field(
        default=None,
        description="meanTimeBetweenFaultsSeconds is the training wall time (since the job's training "
        "first started) divided by faults; absent before the first fault.",
    )
    recommended_interval_seconds: float | None = Field(
        default=None,
        description="recommendedIntervalSeconds is Daly's optimum of the compute time between two "
        "checkpoints, sqrt(2CM)(1 + sqrt(C/2M)/3 + C/18M) - C for save cost C < 2M (else M), with M the "
        "mean time between faults.",
    )
    recommended_interval_steps: Int64 | None = Field(
        default=None,
        description="recommendedIntervalSteps is recommendedIntervalSeconds in steps of "
        "progress.stepTimeSeconds (at least 1).",
    )
    configured_interval_steps: Int64 | None = Field(
        default=None, description="configuredIntervalSteps is spec.checkpoint.intervalSteps."
    )
    message: str | None = Field(
        default=None, description="message says why no interval is advised yet, when none is."
    )


class ResilientTrainingJobStatus(StatusModel):
    """The observed state of a ResilientTrainingJob, written by the operator."""

    observed_generation: Int64 | None = Field(
        default=None, description="observedGeneration is the spec generation the status describes."
    )
    state: JobState | None = Field(
        default=None,
        description="state is Pending, Running, Stalled, Recovering, Blocked, Suspended, Succeeded or "
        "Failed, derived from the conditions for kubectl.",
    )
    conditions: Annotated[
        list[Condition],
        SchemaExtra({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
    ] = Field(
        default_factory=list,
        description="conditions are Ready, Recovering, Stalled, Suspended, Succeeded, Failed, Blocked, "
        "SettingsIgnored.",
    )
    start_time: DateTime | None = Field(
        default=None, description="startTime is when the job's pods were first created."
    )
    completion_time: DateTime | None = Field(
        default=None, description="completionTime is when the job finished."
    )
    workers: WorkersStatus | None = Field(
        default=None, description="workers counts and lists the job's pods."
    )
    store: PodStatus | None = Field(
        default=None,
        description="store is the store pod of a job under faultTolerance.launcher Supervisor (it serves "
        "the training world's stores; its loss restarts every pod), as the operator last saw it.",
    )
    restarts: RestartsStatus | None = Field(default=None, description="restarts counts recoveries per layer.")
    budget: BudgetStatus | None = Field(
        default=None, description="budget is what the failure policy has counted (budgets, backoff)."
    )
    excluded_nodes: Annotated[
        list[ExcludedNode],
        SchemaExtra({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["nodeName"]}),
    ] = Field(default_factory=list, description="excludedNodes are nodes the job no longer schedules onto.")
    node_faults: Annotated[
        list[NodeFault],
        SchemaExtra({"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["nodeName"]}),
    ] = Field(default_factory=list, description="nodeFaults count faults per node.")
    last_checkpoint: CheckpointStatus | None = Field(
        default=None, description="lastCheckpoint is the newest complete checkpoint."
    )
    progress: ProgressStatus | None = Field(default=None, description="progress is the training progress.")
    last_recovery: RecoveryStatus | None = Field(
        default=None, description="lastRecovery is the newest recovery from a fault, once it has ended."
    )
    checkpoint_advice: CheckpointAdviceStatus | None = Field(
        default=None,
        description="checkpointAdvice is the checkpoint interval the measured save cost and fault rate "
        "advise.",
    )

    @classmethod
    def read(cls, raw: Mapping[str, Any]) -> ResilientTrainingJobStatus:
        """A stored status as the models read it. A part they refuse (written by someone else, or by an
        older operator) is read as absent, so that one bad field never stops the job's passes."""
        refused: set[str] = set()
        while True:
            try:
                return cls.model_validate({k: v for k, v in raw.items() if k not in refused})
            except ValidationError as error:
                parts = {str(e["loc"][0]) for e in error.errors() if e["loc"]}
                if not parts - refused:
                    return cls()
                refused |= parts
