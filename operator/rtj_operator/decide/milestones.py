"""Milestone Events: the Events that mark a job's one-time transitions, derivable from its status.

The operator writes status before it acts and posts Events last, so a crash in between loses the
Event of a transition that status already records (the job's pods were created, it succeeded, its
budget ran out). Each milestone Event therefore has a name derived from the job's uid and the reason
(`event_name`), and `runtime.job_pass` posts it under that name: posting it again is answered
AlreadyExists and changes nothing. After every operator start, the first pass of each job posts
again every milestone its status says was reached (`reached`); one a crash lost appears then, one
already posted stays single.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rtj_operator import events
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.actions import Event

# The reasons posted under a name of their own (once per job), with the condition that records
# them in status (None: recorded by status.startTime instead).
MILESTONES: Final[dict[str, tuple[str, str] | None]] = {
    events.CHILDREN_CREATED: None,
    events.JOB_SUCCEEDED: (cond.COND_SUCCEEDED, events.NORMAL),
    events.RESTART_BUDGET_EXHAUSTED: (cond.COND_FAILED, events.WARNING),
}


def children_created(nodes: int, hot_spares: int) -> Event:
    """The Event of the first pass that created the job's pods."""
    return Event(events.NORMAL, events.CHILDREN_CREATED, f"created {nodes} workers, {hot_spares} spares")


def event_name(job: str, uid: str, reason: str) -> str:
    """The Event's name: one per job (its uid, so a re-created job of the same name gets its own)."""
    return f"{job}.{uid.replace('-', '')[:12]}.{reason.lower()}"[:253]


def reached(status: Mapping[str, Any], nodes: int, hot_spares: int) -> list[Event]:
    """The milestone Events that the job's status says are due (already posted or not)."""
    due: list[Event] = []
    if status.get("startTime"):
        due.append(children_created(nodes, hot_spares))
    conditions = cond.read(status)
    for reason, recorded in MILESTONES.items():
        if recorded is None:
            continue
        kind, event_type = recorded
        condition = cond.true_with_reason(conditions, kind, {reason})
        if condition is not None:
            due.append(Event(event_type, reason, condition.message or ""))
    return due
