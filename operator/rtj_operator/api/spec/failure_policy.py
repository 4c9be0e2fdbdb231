"""spec.failurePolicy: the failure budgets, the rules that map exit codes and fault reasons to
actions, node loss and stalls."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, Strict
from rtj_contract import termination

from rtj_operator import constants
from rtj_operator.api.schema import ApiModel, CelRule, Flag, Int32


class FaultClass(enum.StrEnum):
    # NodeLoss: the worker's node is lost (NotReady or unreachable beyond nodeLossGraceSeconds, deleted,
    # or tainted NoExecute without a toleration).
    NODE_LOSS = "NodeLoss"
    # ProcessFailure: the worker pod failed on a healthy node (its ft_launcher gave up).
    PROCESS_FAILURE = "ProcessFailure"
    # Disruption: the worker pod was evicted, preempted, drained or deleted by someone else.
    DISRUPTION = "Disruption"


class FailureAction(enum.StrEnum):
    # FailJob: the job is Failed at once; nothing is replaced.
    FAIL_JOB = "FailJob"
    # RestartJob: every worker pod is recreated (a gang restart).
    RESTART_JOB = "RestartJob"
    # ReplaceWorker: only the lost worker's pod is recreated (a gang restart when it is worker 0, the
    # rendezvous host).
    REPLACE_WORKER = "ReplaceWorker"
    # Ignore: recovered as the fault class would be by default, counted against no budget or backoff.
    IGNORE = "Ignore"


class ExitCodeOperator(enum.StrEnum):
    # In: the exit code is one of values.
    IN = "In"
    # NotIn: the exit code is none of values.
    NOT_IN = "NotIn"


# A fault or disruption reason: one CamelCase word, as Kubernetes condition and event reasons are.
FaultReason = Annotated[
    str,
    Strict(),
    Field(
        min_length=1,
        max_length=termination.FAULT_REASON_MAX_CHARS,
        pattern=rf"^{termination.FAULT_REASON_NAME}$",
    ),
]


ExitCode = Annotated[Int32, Field(ge=1, le=255)]


MAX_FAILURE_RULES: int = 16


MAX_BUDGET_RESTARTS: int = 100


class ExitCodeRequirement(ApiModel):
    """Which non-zero exit codes of the worker container a rule matches."""

    operator: ExitCodeOperator = Field(
        description="operator is In (the exit code is one of values) or NotIn (none of values). Required."
    )
    values: list[ExitCode] = Field(
        min_length=1,
        max_length=255,
        description="values are exit codes from 1 to 255 (a process killed by signal N exits 128+N). "
        "Required; at least one.",
    )


class FailureRule(ApiModel):
    """One rule of the failure policy: what a fault matches, and what is done about it.

    Rules are tried in order; the first that matches a worker's fault decides. A fault no rule matches
    gets its class's default: RestartJob for ProcessFailure, ReplaceWorker for NodeLoss and Disruption.
    """

    cel_rules = (
        CelRule(
            rule=(
                "[has(self.onExitCodes), has(self.onFaultReasons), has(self.onDisruptionReasons)]"
                ".filter(x, x).size() == 1"
            ),
            message="exactly one of onExitCodes, onFaultReasons, onDisruptionReasons must be set",
            check=lambda r: [r.on_exit_codes, r.on_fault_reasons, r.on_disruption_reasons].count(None) == 2,
        ),
    )

    action: FailureAction = Field(
        description="action is FailJob, RestartJob, ReplaceWorker or Ignore (replace as the class's "
        "default would, counted against no budget). Required."
    )
    on_exit_codes: ExitCodeRequirement | None = Field(
        default=None,
        description="onExitCodes matches a ProcessFailure by the worker container's exit code. "
        "Optional; one of onExitCodes, onFaultReasons, onDisruptionReasons.",
    )
    on_fault_reasons: list[FaultReason] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "onFaultReasons matches a ProcessFailure by its fault reason: the trainer's, from a line "
            "'FaultReason: <Reason>' of the container's termination message, else the container's "
            "termination reason (OOMKilled, Error, ContainerCannotRun...). "
            "Optional; one of onExitCodes, onFaultReasons, onDisruptionReasons."
        ),
    )
    on_disruption_reasons: list[FaultReason] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "onDisruptionReasons matches a Disruption by the pod's DisruptionTarget condition reason "
            "(PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager, TerminationByKubelet, "
            "DeletionByPodGC) or its status reason (Evicted, Preempting, Shutdown, Terminated). "
            "Optional; one of onExitCodes, onFaultReasons, onDisruptionReasons."
        ),
    )


class FaultBudget(ApiModel):
    """A budget of one fault class: at most maxRestarts counted faults within windowSeconds."""

    fault_class: FaultClass = Field(
        description="faultClass is NodeLoss, ProcessFailure or Disruption. Required."
    )
    max_restarts: Int32 = Field(
        ge=0,
        le=MAX_BUDGET_RESTARTS,
        description=f"maxRestarts is the number of faults of the class the job recovers from within "
        f"windowSeconds; one more fails the job. Required; 0 to {MAX_BUDGET_RESTARTS}.",
    )
    window_seconds: Int32 = Field(
        default=3600,
        ge=1,
        le=31_536_000,
        description="windowSeconds is the sliding window the faults are counted in; older ones no longer "
        "count. Optional; default: 3600.",
    )


class FailurePolicy(ApiModel):
    """What the operator does when pods or nodes fail."""

    cel_rules = (
        CelRule(
            rule="self.maxBackoffSeconds >= self.backoffSeconds",
            message="maxBackoffSeconds must be at least backoffSeconds",
            check=lambda p: p.max_backoff_seconds >= p.backoff_seconds,
            field_path=".maxBackoffSeconds",
        ),
        CelRule(
            rule=(
                "!has(self.budgets) || "
                "self.budgets.all(b, self.budgets.exists_one(c, c.faultClass == b.faultClass))"
            ),
            message="budgets may name each faultClass once",
            check=lambda p: len({b.fault_class for b in p.budgets}) == len(p.budgets),
            field_path=".budgets",
        ),
    )

    node_loss_grace_seconds: Int32 = Field(
        default=10,
        ge=0,
        le=3600,
        description="nodeLossGraceSeconds is how long a node may be NotReady or unreachable before its "
        "worker is replaced; also the pods' tolerationSeconds for those taints. Optional; default: 10.",
    )
    max_node_replacements: Int32 = Field(
        default=10,
        ge=0,
        le=10000,
        description="maxNodeReplacements is the number of pod replacements for failures (NodeLoss and "
        "ProcessFailure; Disruption too with countDisruptions) before the job is Failed. "
        "Optional; default: 10.",
    )
    count_disruptions: Flag = Field(
        default=False,
        description="countDisruptions makes disruptions (evictions, preemptions, drains, deletions by "
        "others) consume maxNodeReplacements like failures. Optional; default: false.",
    )
    backoff_seconds: Int32 = Field(
        default=5,
        ge=0,
        le=3600,
        description="backoffSeconds is the delay before a replacement after the previous one; it doubles "
        "with each further consecutive fault. Optional; default: 5.",
    )
    max_backoff_seconds: Int32 = Field(
        default=300,
        ge=0,
        le=86400,
        description="maxBackoffSeconds caps the doubled backoff; at least backoffSeconds. "
        "Optional; default: 300.",
    )
    backoff_reset_seconds: Int32 = Field(
        default=600,
        ge=0,
        le=86400,
        description="backoffResetSeconds is how long the job must have been Ready for the next fault to "
        "count as the first of a series again (backoff back to backoffSeconds). Optional; default: 600.",
    )
    repeat_offender_threshold: Int32 = Field(
        default=2,
        ge=1,
        le=1000,
        description="repeatOffenderThreshold is the number of faults on one node before the node is excluded "
        "for the job. Optional; default: 2.",
    )
    taint_excluded_nodes: Flag = Field(
        default=False,
        description="taintExcludedNodes makes the operator taint excluded nodes cluster-wide "
        f"({constants.TAINT_EXCLUDED}:NoSchedule). Optional; default: false.",
    )
    rules: list[FailureRule] = Field(
        default_factory=list,
        max_length=MAX_FAILURE_RULES,
        description="rules choose the action for faults by exit code, fault reason or disruption reason; "
        "the first matching rule wins. Optional; default: empty (each fault class's default action).",
    )
    budgets: list[FaultBudget] = Field(
        default_factory=list,
        max_length=3,
        description="budgets limit the faults of a class within a time window, in addition to "
        "maxNodeReplacements; one per faultClass. Optional; default: empty (no windowed budget).",
    )
