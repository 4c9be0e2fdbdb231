"""Training that fails the same way at the same step: a bug that raises there, a corrupt sample, a
NaN the script turns into an exception. No restart gets past it, and each one spends the budget and a
restart's time for nothing, so two signs fail the job at once (`Failed`, reason
`DeterministicFailure`, the message naming the step and the error), spending no budget:

- rtj-launch's verdict: a worker container whose termination message carries the line
  `FaultReason: DeterministicFailure`, which rtj-launch writes when two generations of its ranks in a
  row failed with the same exit code and error after the same step
  (`rtj_trainer.runtime.launcher_view.repeated_failure`);
- NVRx's own: a worker container that exited `termination.NO_RESTART_EXIT_CODE` (93), what NVRx 0.7's
  ft_launcher reports when it decided the job must not be restarted, and the status rtj-launch gives
  its own verdict.

`failures.judge` makes either a FailJob verdict after the user's failurePolicy rules, so a rule that
matches first wins: `{action: RestartJob, onFaultReasons: [DeterministicFailure]}` (or `onExitCodes:
[93]`) keeps restarting until the budget says no.

Pure.
"""

from __future__ import annotations

from rtj_contract import termination

from rtj_operator import events
from rtj_operator.observe import PodState


def launcher_stopped(pod: PodState | None) -> bool:
    """Whether the pod's launcher stopped the training for a failure that recurs at one step."""
    if pod is None:
        return False
    return (
        pod.fault_reason == events.DETERMINISTIC_FAILURE or pod.exit_code == termination.NO_RESTART_EXIT_CODE
    )


def launcher_message(index: int, pod: PodState | None, fallback: str) -> str:
    """The Failed condition's message: the worker and the evidence (the step, the error)."""
    detail = (pod.fault_detail if pod is not None else "") or fallback
    name = f" (pod {pod.name})" if pod is not None else ""
    return f"worker {index}{name} fails the same way at the same step whatever the restart: {detail}"
