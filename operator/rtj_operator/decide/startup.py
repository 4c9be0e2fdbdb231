"""Training that cannot start: a worker's command that fails before its first step ends the job at once.

A wrong script path, a missing module, a syntax error: the command fails the same way on every try,
and each restart spends the budget and a restart's time for nothing. Two signs fail the job at once
(`Failed`, reason `StartupFailed`, the message naming what failed), spending no budget:

- rtj-launch's verdict (`launcher_gave_up`): a worker container whose termination message carries the
  line `FaultReason: StartupFailed`, which rtj-launch writes when two generations of its ranks failed
  the same way before any step. `failures.judge` makes it a FailJob verdict after the user's
  failurePolicy rules, so a rule that matches it first wins. The store pod's rtj-store writes the
  same line when it cannot serve as configured (an NVRx release whose rendezvous it cannot host):
  that fails the job too, where any other loss of the store pod restarts the gang.
- Without that verdict (an image of one's own, an older rtj-launch): the same worker failing with the
  same exit code and message (numbers aside: a log tail's times and process ids differ on every try)
  on `STARTUP_FAILURES_TO_FAIL` consecutive pods before any step (`record_start_failure`), counted per
  worker in `status.workers.pods[].startFailures`.

"Before any step": no training step advanced while the pod existed (`status.progress.lastAdvanceTime`
is before the pod's creation). For a job that reports no step that is always so; the count therefore
also starts again when a recovery ends on the evidence of training (a step, or every worker's ranks
running: `decide.training` calls `forget_start_failures`), so only failures between which the job
never got going count.

Pure: the pass state in, the workers' records changed.
"""

from __future__ import annotations

import re

from rtj_contract.times import parse_rfc3339

from rtj_operator import events
from rtj_operator.decide.state import STORE, WORKER, PassState
from rtj_operator.observe import MAX_TERMINATION_MESSAGE_CHARS, PodState

# Consecutive pods of one worker failing the same way before any step that fail the job: one more
# than the tries rtj-launch's own verdict takes, so an image without that verdict is judged too.
STARTUP_FAILURES_TO_FAIL = 3
_NUMBERS = re.compile(r"\d+")


def launcher_gave_up(pod: PodState | None) -> bool:
    """Whether the pod's launcher said its training command cannot start (`FaultReason: StartupFailed`)."""
    return pod is not None and pod.fault_reason == events.STARTUP_FAILED


def launcher_message(role: str, index: int, pod: PodState | None, fallback: str) -> str:
    """The Failed condition's message for the verdict of rtj-launch (a worker) or rtj-store (the store
    pod): the pod and what failed."""
    detail = (pod.fault_detail if pod is not None else "") or fallback
    name = f" (pod {pod.name})" if pod is not None else ""
    if role == STORE:
        return f"the store pod{name} cannot serve the job's stores as configured: {detail}"
    return f"worker {index}{name} cannot start its training command: {detail}"


def record_start_failure(run: PassState, index: int, pod: PodState | None, *, counts: bool) -> str | None:
    """Record the failure of worker `index`'s pod; the message that fails the job once the worker has
    failed the same way `STARTUP_FAILURES_TO_FAIL` times in a row, else None.

    `counts` is False for a loss that is not the worker's own failure as the default policy judges it
    (a node loss or disruption, a failure a failurePolicy rule matched, a consequence of another
    fault): it ends the series.
    """
    entry = run.entry(WORKER, index)
    signature = _signature(pod) if counts and pod is not None and _before_any_step(run, pod) else None
    if signature is None:
        entry.start_failures, entry.last_start_failure = 0, ""
        return None
    same = entry.start_failures and _same_failure(signature, entry.last_start_failure)
    entry.start_failures, entry.last_start_failure = (entry.start_failures + 1 if same else 1), signature
    if entry.start_failures < STARTUP_FAILURES_TO_FAIL:
        return None
    return (
        f"worker {index} failed the same way on {entry.start_failures} consecutive pods before any "
        f"training step: {signature}"
    )


def forget_start_failures(run: PassState) -> None:
    """Training got going (a step advanced, or a recovery ended on the ranks): every worker's series ends."""
    for entry in run.entries.values():
        entry.start_failures, entry.last_start_failure = 0, ""


def _signature(pod: PodState) -> str | None:
    """What a failure is compared by: the exit code and the termination message (else the pod's)."""
    if pod.exit_code is None:
        return None
    text = f"exit {pod.exit_code}: {pod.fault_detail or pod.message}"
    return text[:MAX_TERMINATION_MESSAGE_CHARS]


def _same_failure(one: str, other: str) -> bool:
    """Whether two signatures name the same failure: the same exit code, and the same message but for
    its numbers (a log tail's times, process ids and ports differ from one try to the next)."""
    code, _, message = one.partition(": ")
    other_code, _, other_message = other.partition(": ")
    return code == other_code and _NUMBERS.sub("#", message) == _NUMBERS.sub("#", other_message)


def _before_any_step(run: PassState, pod: PodState) -> bool:
    """Whether no training step advanced while the pod existed."""
    advanced = parse_rfc3339(run.progress.last_advance_time if run.progress is not None else None)
    return advanced is None or (pod.created is not None and advanced < pod.created)
