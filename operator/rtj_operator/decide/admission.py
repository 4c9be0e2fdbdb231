"""Admission: children the API server refused, and when to try creating them again.

A create refused with 400, 403, 404 or 422 (an invalid object, a ResourceQuota, an admission
policy, Pod Security, a kind the cluster does not serve) is refused again until something changes.
`rtj_operator.runtime.kube` reports it as a `Refusal`; `record_refusal` turns it, in the same pass,
into `Blocked=True` with reason `QuotaExceeded` (a ResourceQuota refused it) or `ChildRejected`, the
API server's own message, and a Warning Event (only when the condition is new or says something new).

While that condition stands for the job's current generation, `hold_creates` drops the pass's
creates: they are tried again when the spec changes (a new generation) or `REFUSAL_RECHECK_SECONDS`
after the last refusal (a quota may have been raised, a policy relaxed). `clear_refusal` sets the
condition False once every worker has a pod. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rtj_contract.times import parse_rfc3339

from rtj_operator import events
from rtj_operator.api import Condition
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.actions import CreateObject, Event
from rtj_operator.decide.state import WORKER, PassState

# A refused child is tried again this long after the last refusal even if the spec did not change.
REFUSAL_RECHECK_SECONDS = 300.0
# The API server's message is kept whole up to this many characters (a condition is not a log).
MAX_MESSAGE_CHARS = 1024
# HTTP statuses of a create that the same request will meet again: not retried with backoff. 404: the
# cluster does not serve the kind (an opt-in PodGroup without the scheduler-plugins CRD installed).
PERMANENT_CODES = frozenset({400, 403, 404, 422})


@dataclass(frozen=True)
class Refusal:
    """A create the API server refused for good: which child, the HTTP code, Status reason and message."""

    kind: str
    name: str
    code: int
    reason: str  # the Status's reason: Forbidden, Invalid, BadRequest
    message: str  # the Status's message, with the fields its causes name

    @property
    def condition_reason(self) -> str:
        # The quota admission plugin's message: `... is forbidden: exceeded quota: <name>, requested: ...`
        return events.QUOTA_EXCEEDED if "exceeded quota" in self.message else events.CHILD_REJECTED

    def describe(self) -> str:
        text = (
            f"{self.kind} {self.name} refused by the API server ({self.code} {self.reason}): {self.message}"
        )
        return truncate(text, MAX_MESSAGE_CHARS)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _blocked(conditions: list[Condition]) -> Condition | None:
    return cond.true_with_reason(conditions, cond.COND_BLOCKED, cond.REFUSAL_REASONS)


def record_refusal(
    status: Mapping[str, Any], generation: int, refusal: Refusal, now: datetime
) -> tuple[dict[str, Any], bool, tuple[Event, ...]]:
    """The job's status with Blocked=True for `refusal`; returns (status, changed, events)."""
    conditions = cond.read(status)
    reason, message = refusal.condition_reason, refusal.describe()
    before = _blocked(conditions)
    repeated = (
        before is not None
        and before.reason == reason
        and before.message == message
        and before.observed_generation == generation
    )
    cond.set_condition(
        conditions,
        cond.COND_BLOCKED,
        status=True,
        reason=reason,
        message=message,
        now=now,
        generation=generation,
    )
    new = cond.rewritten(status, conditions)
    emitted = () if repeated else (Event(events.WARNING, reason, message),)
    return new, new != dict(status), emitted


def held_until(run: PassState) -> datetime | None:
    """Until when this pass's creates are held back after a refusal, or None when they are not."""
    blocked = _blocked(run.conditions)
    if blocked is None or blocked.observed_generation != run.job.generation:
        return None  # never refused, or the spec changed since: try
    since = run.observed.refused_at or parse_rfc3339(blocked.last_transition_time) or run.now
    until = since + timedelta(seconds=REFUSAL_RECHECK_SECONDS)
    return until if until > run.now else None


def hold_creates(run: PassState) -> None:
    """Drop the creates of a pass over a job whose child was refused, until the spec or time says try."""
    until = held_until(run)
    if until is None:
        return
    run.actions = [a for a in run.actions if not isinstance(a, CreateObject)]
    run.created_pods = False
    run.holding = True
    run.at(until)


def clear_refusal(run: PassState) -> None:
    """Blocked by a refusal, and every worker has a pod now: the refusal is over."""
    if _blocked(run.conditions) is None:
        return
    if all(run.pod(WORKER, i) is not None for i in range(run.job.nodes)):
        run.condition(cond.COND_BLOCKED, False, cond.REASON_NOT_BLOCKED, "every worker pod was created")
