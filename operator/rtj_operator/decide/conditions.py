"""Conditions (status.conditions) and the state derived from them (status.state).

Conditions follow the Kubernetes API conventions: one per type, `lastTransitionTime` moves only when
`status` flips. `state_from_conditions` gives kubectl's State column (`api.JobState`). The condition
types, and the condition reasons that are not also Event reasons, are named here; Event reasons are
`rtj_operator.events`'.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from rtj_contract.times import format_rfc3339, parse_rfc3339

from rtj_operator import events
from rtj_operator.api import Condition, ConditionStatus, JobState, ResilientTrainingJobStatus

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
REFUSAL_REASONS: Final = frozenset({events.CHILD_REJECTED, events.QUOTA_EXCEEDED})

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


def set_condition(  # noqa: PLR0913 - keyword-only, each a named field; callers pass them by name
    conditions: list[Condition],
    type_: str,
    *,
    status: bool | ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> bool:
    """Set a condition in place; lastTransitionTime moves only when `status` flips. Returns flipped.

    `status` is True or False, or a `ConditionStatus` (Unknown: the operator cannot tell)."""
    value = (
        status
        if isinstance(status, ConditionStatus)
        else ConditionStatus.TRUE
        if status
        else ConditionStatus.FALSE
    )
    condition = find(conditions, type_)
    if condition is None:
        conditions.append(
            Condition(
                type=type_,
                status=value,
                reason=reason,
                message=message,
                last_transition_time=format_rfc3339(now),
                observed_generation=generation,
            )
        )
        return True
    flipped = condition.status != value
    condition.status, condition.reason, condition.message = value, reason, message
    condition.observed_generation = generation
    if flipped or not condition.last_transition_time:
        condition.last_transition_time = format_rfc3339(now)
    return flipped


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of `type_`, if there is one."""
    return next((c for c in conditions if c.type == type_), None)


def true_with_reason(
    conditions: Sequence[Condition], type_: str, reasons: Collection[str]
) -> Condition | None:
    """The condition of `type_` if it is True for one of `reasons`."""
    condition = find(conditions, type_)
    if condition is None or condition.status != ConditionStatus.TRUE or condition.reason not in reasons:
        return None
    return condition


def condition_true(conditions: Sequence[Condition], type_: str) -> bool:
    return any(c.type == type_ and c.status == ConditionStatus.TRUE for c in conditions)


def condition_set(conditions: Sequence[Condition], type_: str) -> bool:
    """Whether a condition of `type_` exists at all (true or not)."""
    return find(conditions, type_) is not None


def ready_since(conditions: Sequence[Condition], now: datetime) -> datetime | None:
    """When every worker last became ready (Ready's transition), if they all are now."""
    ready = find(conditions, COND_READY)
    if ready is None or ready.status != ConditionStatus.TRUE:
        return None
    return parse_rfc3339(ready.last_transition_time) or now


def finished(conditions: Sequence[Condition]) -> bool:
    """Succeeded or Failed: the job is done and only its cleanup (and TTL) remain."""
    return condition_true(conditions, COND_SUCCEEDED) or condition_true(conditions, COND_FAILED)


# The most significant condition first: a failed job that was also suspended reads Failed.
_STATE_BY_CONDITION = (
    (COND_FAILED, JobState.FAILED),
    (COND_SUCCEEDED, JobState.SUCCEEDED),
    (COND_SUSPENDED, JobState.SUSPENDED),
    # A job that cannot get its pods says so before anything about its training.
    (COND_BLOCKED, JobState.BLOCKED),
    # A recovery that does not resume training within the stall time reads Stalled: stuck, not healing.
    (COND_STALLED, JobState.STALLED),
    (COND_RECOVERING, JobState.RECOVERING),
    (COND_READY, JobState.RUNNING),
)


def state_from_conditions(conditions: Sequence[Condition]) -> JobState:
    """status.state, for kubectl: the most significant true condition."""
    for type_, state in _STATE_BY_CONDITION:
        if condition_true(conditions, type_):
            return state
    return JobState.PENDING


def sorted_conditions(conditions: Sequence[Condition]) -> list[Condition]:
    """Conditions in the order of `CONDITION_TYPES` (unknown types last)."""
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(conditions, key=lambda c: order.get(c.type, len(order)))


def rewritten(status: Mapping[str, Any], conditions: Sequence[Condition]) -> dict[str, Any]:
    """A stored `status` with these conditions (in their order) and the state they give, as written."""
    new = dict(status)
    new["conditions"] = [c.to_status() for c in sorted_conditions(conditions)]
    new["state"] = state_from_conditions(conditions).value
    return new


def read(status: Mapping[str, Any]) -> list[Condition]:
    """A stored status's conditions, as their model reads them."""
    return ResilientTrainingJobStatus.read({"conditions": status.get("conditions") or []}).conditions
