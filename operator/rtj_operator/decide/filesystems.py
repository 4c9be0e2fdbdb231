"""File systems: a job's static FSx volume is created only if the administrator allowed it for the job's
namespace (`rtj_operator.fsx_policy`, given to the operator and carried in `Observed.fsx_allowed`).

`hold_disallowed` drops every create of the pass (no PersistentVolume, claim, Service or pod) and
sets `Blocked=True` with reason `FileSystemNotAllowed` and a message naming the field and the
namespace, with a Warning Event when the condition is new or says something new. The verdict
depends only on the spec and the allow-list, so it is made again on every pass: a spec naming an
allowed file system (or an operator restarted with a wider allow-list) clears it. Pods that already
run are left alone; only creates are held. Pure.
"""

from __future__ import annotations

from rtj_operator import events
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.actions import CreateObject
from rtj_operator.decide.state import PassState


def refusal(run: PassState) -> str | None:
    """Why the job's FSx file system may not be mounted in its namespace, or None."""
    fsx = run.job.model.spec.checkpoint.storage.fsx_static
    if fsx is None:
        return None
    return run.observed.fsx_allowed.refusal(run.job.namespace, fsx.file_system_id, fsx.dns_name)


def _blocked_by_policy(run: PassState) -> str | None:
    """The message of a standing FileSystemNotAllowed condition, or None."""
    blocked = cond.true_with_reason(run.conditions, cond.COND_BLOCKED, {events.FILE_SYSTEM_NOT_ALLOWED})
    return str(blocked.message) if blocked is not None else None


def hold_disallowed(run: PassState) -> None:
    """No create while the job names a file system not allowed for its namespace (see module doc)."""
    message = refusal(run)
    said = _blocked_by_policy(run)
    if message is None:
        if said is not None:
            run.condition(
                cond.COND_BLOCKED,
                False,
                cond.REASON_NOT_BLOCKED,
                "the checkpoint file system is allowed for the namespace",
            )
        return
    run.actions = [a for a in run.actions if not isinstance(a, CreateObject)]
    run.created_pods = False
    run.holding = True
    run.condition(cond.COND_BLOCKED, True, events.FILE_SYSTEM_NOT_ALLOWED, message)
    if said != message:
        run.event(events.WARNING, events.FILE_SYSTEM_NOT_ALLOWED, message)
