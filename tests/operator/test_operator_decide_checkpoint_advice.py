"""Checkpoint interval advice (decide.checkpoint_advice): Young's and Daly's optimum on known values,
and the advice a job's status carries from its trainers' reports."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from operator_world import T0, WORKER, World, running_world
from rtj_contract.times import format_rfc3339
from rtj_operator.decide.checkpoint_advice import (
    ADVICE_FIELDS,
    NO_FAULT_YET,
    NO_SAVE_YET,
    advise,
    daly_interval_seconds,
    interval_steps,
    young_interval_seconds,
)
from rtj_operator.progress import parse_report


@pytest.mark.parametrize(
    ("cost", "mtbf", "young", "daly"),
    [
        # C = 10 s, M = 1 h: sqrt(72000) = 268.33; x (1 + sqrt(10/7200)/3 + 10/64800) - 10 = 261.70.
        (10.0, 3600.0, 268.3282, 261.7029),
        # C = 60 s, M = 1 day.
        (60.0, 86400.0, 3219.9379, 3180.0621),
        # C = 30 s, M = 30 min.
        (30.0, 1800.0, 328.6335, 308.9378),
    ],
)
def test_young_and_daly_on_known_values(cost: float, mtbf: float, young: float, daly: float) -> None:
    assert young_interval_seconds(cost, mtbf) == pytest.approx(young, abs=1e-4)
    assert daly_interval_seconds(cost, mtbf) == pytest.approx(daly, abs=1e-4)
    # Daly's estimate stays below Young's (it subtracts the save itself) and close to it for C << M.
    assert daly < young


def test_daly_is_the_mean_time_between_faults_once_a_save_costs_twice_as_much() -> None:
    assert daly_interval_seconds(100.0, 40.0) == 40.0
    assert daly_interval_seconds(80.0, 40.0) == 40.0
    # Just below 2M the formula applies.
    assert daly_interval_seconds(79.0, 40.0) == pytest.approx(
        math.sqrt(2 * 79 * 40) * (1 + math.sqrt(79 / 80) / 3 + 79 / 720) - 79
    )


def test_intervals_in_steps_and_bad_inputs() -> None:
    assert interval_steps(261.7029, 0.5) == 523
    assert interval_steps(0.2, 5.0) == 1  # never below one step
    for bad in [(0.0, 3600.0), (-1.0, 3600.0), (10.0, 0.0), (math.inf, 1.0), (math.nan, 1.0)]:
        with pytest.raises(ValueError, match="positive finite"):
            daly_interval_seconds(*bad)


def known(advice: dict[str, Any]) -> dict[str, Any]:
    """The fields that have a value (the others are null, which removes them from the stored status)."""
    assert set(advice) == set(ADVICE_FIELDS)
    return {k: v for k, v in advice.items() if v is not None}


def test_advice_needs_a_save_and_a_fault() -> None:
    base = {"training_seconds": 7200.0, "step_seconds": 0.5, "configured_steps": 100}
    assert known(advise(save_cost_seconds=None, faults=2, **base)) == {  # type: ignore[arg-type]
        "configuredIntervalSteps": 100,
        "faults": 2,
        "meanTimeBetweenFaultsSeconds": 3600.0,
        "message": NO_SAVE_YET,
    }
    assert known(advise(save_cost_seconds=10.0, faults=0, **base)) == {  # type: ignore[arg-type]
        "configuredIntervalSteps": 100,
        "faults": 0,
        "saveCostSeconds": 10.0,
        "message": NO_FAULT_YET,
    }
    assert known(advise(save_cost_seconds=10.0, faults=2, **base)) == {  # type: ignore[arg-type]
        "configuredIntervalSteps": 100,
        "faults": 2,
        "saveCostSeconds": 10.0,
        "meanTimeBetweenFaultsSeconds": 3600.0,
        "recommendedIntervalSeconds": 261.7,
        "recommendedIntervalSteps": 523,
    }


def test_a_save_that_blocks_for_microseconds_is_a_measured_save_not_none() -> None:
    # An async save of a small model blocks only for its staging copy: 40 µs is still a save.
    advice = advise(
        save_cost_seconds=0.0000412345, faults=1, training_seconds=60.0, step_seconds=0.2, configured_steps=2
    )
    assert advice["saveCostSeconds"] == 0.00004123 and advice["message"] is None
    assert advice["recommendedIntervalSteps"] >= 1


def report(step: int, *, at: float, blocking: float, in_process: int = 0, in_job: int = 0) -> str:
    return json.dumps(
        {
            "v": 1,
            "time": format_rfc3339(T0 + timedelta(seconds=at)),
            "step": step,
            "restarts": {"inProcess": in_process, "inJob": in_job},
            "stepTimeSeconds": 0.5,
            "checkpointBlockingSeconds": blocking,
            "usefulStepSeconds": 1.0,
            "trainStartTime": format_rfc3339(T0),
        }
    )


def feed(world: World, texts: list[str]) -> None:
    for index, text in enumerate(texts):
        pod = world.pod(WORKER, index)
        parsed = parse_report(text)
        assert pod is not None and parsed is not None
        world.reports[pod["metadata"]["uid"]] = parsed


def test_status_advises_from_the_slowest_save_and_the_faults_counted() -> None:
    world = running_world(checkpoint={"intervalSteps": 50, "storage": {"dynamic": {}}})
    # No fault yet: the save cost is measured, no interval is advised.
    feed(world, [report(100, at=3600, blocking=8.0), report(100, at=3600, blocking=10.0)])
    world.reconcile()
    advice = known(world.status()["checkpointAdvice"])
    assert advice == {
        "configuredIntervalSteps": 50,
        "faults": 0,
        "saveCostSeconds": 10.0,
        "message": NO_FAULT_YET,
    }
    # Two in-process restarts in two hours of training: M = 1 h.
    feed(world, [report(200, at=7200, blocking=0, in_process=2), report(200, at=7200, blocking=0)])
    world.tick(5)
    world.reconcile()
    advice = known(world.status()["checkpointAdvice"])
    # The newest reports measured no save: the cost measured before is kept.
    assert advice["saveCostSeconds"] == 10.0 and advice["faults"] == 2
    assert advice["meanTimeBetweenFaultsSeconds"] == 3600.0
    assert advice["recommendedIntervalSeconds"] == 261.7
    assert advice["recommendedIntervalSteps"] == 523
    # The message of the earlier advice is cleared (null, so the merge patch of status removes it).
    assert "message" not in advice and world.status()["checkpointAdvice"]["message"] is None
    # No report: the advice stays as it was (an idle job's status is not rewritten).
    world.reports.clear()
    world.tick(60)
    assert not world.reconcile().status_changed
