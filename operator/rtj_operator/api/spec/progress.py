"""spec.progress: how the operator learns a script's steps (the step log pattern) and when no step
means a stall."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, Strict

from rtj_operator.api.schema import ApiModel, Int32

# A stall is reported after this long without a training step by default: longer than a checkpoint
# load and a restart of a large job take, far shorter than a lost night.
DEFAULT_STALL_AFTER_SECONDS: int = 600


MAX_STALL_AFTER_SECONDS: int = 7 * 86400


MAX_STEP_LOG_PATTERN_LENGTH: int = 256


def _check_step_log_pattern(pattern: str) -> str:
    """A Python regex with a group for the step: ``step``, else the first group (which must not be
    ``loss``). Checked in Python only: CEL cannot compile a Python regex."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"stepLogPattern is not a Python regular expression: {error}") from None
    if "step" in compiled.groupindex:
        return pattern
    if compiled.groups == 0:
        raise ValueError(
            "stepLogPattern needs a group for the step: a named group (?P<step>...) or any group"
        )
    if compiled.groupindex.get("loss") == 1:
        raise ValueError("stepLogPattern's first group is the loss: name the step's group (?P<step>...)")
    return pattern


StepLogPattern = Annotated[
    str,
    Strict(),
    Field(min_length=1, max_length=MAX_STEP_LOG_PATTERN_LENGTH),
    AfterValidator(_check_step_log_pattern),
]


class ProgressSpec(ApiModel):
    """How the operator judges the training progress its workers report."""

    stall_after_seconds: Int32 = Field(
        default=DEFAULT_STALL_AFTER_SECONDS,
        ge=1,
        le=MAX_STALL_AFTER_SECONDS,
        description=(
            "stallAfterSeconds is how long every worker may be ready while the training step does not "
            "advance before the job is reported Stalled (a condition and a Warning Event; nothing is "
            "restarted). It counts from the step's last advance or from when the workers last all became "
            "ready, whichever is later, so a restart the operator makes is not a stall until its workers "
            f"are ready. Optional; default: {DEFAULT_STALL_AFTER_SECONDS}; 1 to {MAX_STALL_AFTER_SECONDS}."
        ),
    )
    step_log_pattern: StepLogPattern | None = Field(
        default=None,
        description=(
            "stepLogPattern is a Python regular expression that rtj-launch matches against each line the "
            "training processes write (stdout and stderr; the lines still go to the container's log): a "
            "match reports the training step, from the named group step (else the first group), and the "
            "loss from an optional named group loss, as local rank 0 prints them (another rank's when rank "
            "0 prints none). It gives a script of your own, which reports no progress otherwise, a step and "
            "loss in the job's status, recoveries timed to the next step and stall detection; the rtj "
            "library's reports win over it. For example ^step (?P<step>\\d+) loss (?P<loss>\\S+). The API "
            "server cannot compile a Python regex: the operator refuses a job (Ready=False, reason "
            "InvalidSpec) whose pattern does not compile or has no group for the step, and so does "
            f"`rtj render`. Optional; default: none (no step from the log); at most "
            f"{MAX_STEP_LOG_PATTERN_LENGTH} characters."
        ),
    )
