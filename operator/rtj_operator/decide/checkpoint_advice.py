"""Checkpoint interval advice: the interval that loses the least time to saves and faults together.

Checkpointing often costs the time each save blocks training; checkpointing rarely costs the work
redone after each fault. Young's first-order optimum of the compute time between two checkpoints is
T = sqrt(2 C M), for a save that blocks training C seconds and a mean time between faults M; Daly's
higher-order refinement (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", 2006) is T = sqrt(2 C M) (1 + sqrt(C / 2M) / 3 + C / 18M) - C for C < 2M, and M
otherwise. `advise` applies Daly's estimate to what the job measured: the save cost its trainers report
(`checkpointBlockingSeconds`, the time the newest save blocked the step loop: an async save blocks only
for its staging copy), the faults status counts (`restarts.total`) over its training wall time, and the
step time, which turns seconds into steps. `reconciler` writes the result to `status.checkpointAdvice`.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from typing import Any

from rtj_operator.api import CheckpointAdviceStatus

# status.checkpointAdvice's fields, by their JSON names: `advise` gives each (null when unknown).
ADVICE_FIELDS = tuple(field.alias or name for name, field in CheckpointAdviceStatus.model_fields.items())
# Without a fault there is no rate to advise from: said in the status instead of a number.
NO_FAULT_YET = "no fault counted yet: no interval to advise"
NO_SAVE_YET = "no checkpoint save measured yet: no interval to advise"


def young_interval_seconds(save_cost_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimum compute time between checkpoints: sqrt(2 C M)."""
    _check_positive(save_cost_seconds, mtbf_seconds)
    return math.sqrt(2.0 * save_cost_seconds * mtbf_seconds)


def daly_interval_seconds(save_cost_seconds: float, mtbf_seconds: float) -> float:
    """Daly's optimum: sqrt(2CM) (1 + sqrt(C/2M)/3 + C/18M) - C for C < 2M, else M."""
    _check_positive(save_cost_seconds, mtbf_seconds)
    cost, mtbf = save_cost_seconds, mtbf_seconds
    if cost >= 2.0 * mtbf:
        return mtbf
    ratio = cost / (2.0 * mtbf)
    return math.sqrt(2.0 * cost * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost


def interval_steps(interval_seconds: float, step_seconds: float) -> int:
    """An interval in whole steps of `step_seconds`, at least 1."""
    _check_positive(interval_seconds, step_seconds)
    return max(1, round(interval_seconds / step_seconds))


def _check_positive(*values: float) -> None:
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"expected positive finite numbers, got {values}")


def advise(
    *,
    save_cost_seconds: float | None,
    faults: int,
    training_seconds: float | None,
    step_seconds: float | None,
    configured_steps: int,
) -> dict[str, Any]:
    """`status.checkpointAdvice`: the measured inputs, and Daly's interval once they are all known.

    Every field is present, None when unknown: status is written as a merge patch, in which only a
    null removes a field that an earlier advice had (a stale `message` beside a recommendation).
    """
    advice: dict[str, Any] = dict.fromkeys(ADVICE_FIELDS)
    advice.update(configuredIntervalSteps=configured_steps, faults=faults)
    if save_cost_seconds is not None and save_cost_seconds > 0:
        # Four significant digits: an async save of a small model blocks for microseconds, which
        # four decimals would round to 0 ("no save measured").
        advice["saveCostSeconds"] = float(f"{save_cost_seconds:.4g}")
    if faults > 0 and training_seconds is not None and training_seconds > 0:
        advice["meanTimeBetweenFaultsSeconds"] = max(0.1, round(training_seconds / faults, 1))
    cost = advice.get("saveCostSeconds")
    mtbf = advice.get("meanTimeBetweenFaultsSeconds")
    if not cost:
        advice["message"] = NO_SAVE_YET
        return advice
    if not mtbf:
        advice["message"] = NO_FAULT_YET
        return advice
    interval = daly_interval_seconds(cost, mtbf)
    advice["recommendedIntervalSeconds"] = round(interval, 1)
    if step_seconds is not None and step_seconds > 0:
        advice["recommendedIntervalSteps"] = interval_steps(interval, step_seconds)
    return advice
