"""Conditions (status.conditions) and the state derived from them (status.state).

Conditions follow the Kubernetes API conventions: one per type, `lastTransitionTime` moves only when
`status` flips. `state_from_conditions` gives kubectl's State column (`api.JobState`). The condition
types, and the condition reasons that are not also Event reasons, are named here; Event reasons are
`rtj_operator.events`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from rtj_contract.times import format_rfc3339, parse_rfc3339

from rtj_operator import events
from rtj_operator.api import ConditionStatus, JobState

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
    conditions: list[dict[str, Any]],
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
    value = status.value if isinstance(status, ConditionStatus) else ("True" if status else "False")
    for condition in conditions:
        if condition.get("type") == type_:
            flipped = condition.get("status") != value
            condition.update(status=value, reason=reason, message=message, observedGeneration=generation)
            if flipped or not condition.get("lastTransitionTime"):
                condition["lastTransitionTime"] = format_rfc3339(now)
            return flipped
    conditions.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_rfc3339(now),
            "observedGeneration": generation,
        }
    )
    return True


def condition_true(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def condition_set(conditions: Sequence[Mapping[str, Any]], type_: str) -> bool:
    """Whether a condition of `type_` exists at all (true or not)."""
    return any(c.get("type") == type_ for c in conditions)


def ready_since(conditions: Sequence[Mapping[str, Any]], now: datetime) -> datetime | None:
    """When every worker last became ready (Ready's transition), if they all are now."""
    ready = next((c for c in conditions if c.get("type") == COND_READY), None)
    if ready is None or ready.get("status") != "True":
        return None
    return parse_rfc3339(ready.get("lastTransitionTime")) or now


def finished(conditions: Sequence[Mapping[str, Any]]) -> bool:
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


def state_from_conditions(conditions: Sequence[Mapping[str, Any]]) -> JobState:
    """status.state, for kubectl: the most significant true condition."""
    for type_, state in _STATE_BY_CONDITION:
        if condition_true(conditions, type_):
            return state
    return JobState.PENDING


def sorted_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions in the order of `CONDITION_TYPES` (unknown types last)."""
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(conditions, key=lambda c: order.get(str(c.get("type")), len(order)))
