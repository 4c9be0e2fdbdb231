"""Conditions (status.conditions) and the state derived from them (status.state).

Conditions follow the Kubernetes API conventions: one per type, `lastTransitionTime` moves only when
`status` flips. `state_from_conditions` gives kubectl's State column (`api.JobState`). The condition
types and reasons are named in `rtj_operator.events`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rtj_operator import events
from rtj_operator.api import ConditionStatus, JobState
from rtj_operator.progress import format_time, parse_time


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
                condition["lastTransitionTime"] = format_time(now)
            return flipped
    conditions.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_time(now),
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
    ready = next((c for c in conditions if c.get("type") == events.COND_READY), None)
    if ready is None or ready.get("status") != "True":
        return None
    return parse_time(ready.get("lastTransitionTime")) or now


def finished(conditions: Sequence[Mapping[str, Any]]) -> bool:
    """Succeeded or Failed: the job is done and only its cleanup (and TTL) remain."""
    return condition_true(conditions, events.COND_SUCCEEDED) or condition_true(conditions, events.COND_FAILED)


# The most significant condition first: a failed job that was also suspended reads Failed.
_STATE_BY_CONDITION = (
    (events.COND_FAILED, JobState.FAILED),
    (events.COND_SUCCEEDED, JobState.SUCCEEDED),
    (events.COND_SUSPENDED, JobState.SUSPENDED),
    # A job that cannot get its pods says so before anything about its training.
    (events.COND_BLOCKED, JobState.BLOCKED),
    # A recovery that does not resume training within the stall time reads Stalled: stuck, not healing.
    (events.COND_STALLED, JobState.STALLED),
    (events.COND_RECOVERING, JobState.RECOVERING),
    (events.COND_READY, JobState.RUNNING),
)


def state_from_conditions(conditions: Sequence[Mapping[str, Any]]) -> str:
    """status.state, for kubectl: the most significant true condition."""
    for type_, state in _STATE_BY_CONDITION:
        if condition_true(conditions, type_):
            return state.value
    return JobState.PENDING.value


def sorted_conditions(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions in the order of `events.CONDITION_TYPES` (unknown types last)."""
    order = {t: i for i, t in enumerate(events.CONDITION_TYPES)}
    return sorted(conditions, key=lambda c: order.get(str(c.get("type")), len(order)))
