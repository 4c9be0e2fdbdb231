"""The progress fold and goodput arithmetic: fixed inputs, expected figures."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from operator_world import World, job_body
from rtj_operator import constants
from rtj_operator.progress import RestartOffset, fold_progress, goodput_percent, parse_report

START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def report(
    step: int,
    *,
    in_process: int = 0,
    in_job: int = 0,
    checkpoint: int | None = None,
    at: int = 100,
    useful: float = 50.0,
) -> str:
    body: dict[str, object] = {
        "v": 1,
        "time": (START + timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nodeRank": 0,
        "step": step,
        "restarts": {"inProcess": in_process, "inJob": in_job},
        "stepTimeSeconds": 0.25,
        "usefulStepSeconds": useful,
        "trainStartTime": START.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if checkpoint is not None:
        body["lastCheckpoint"] = {"step": checkpoint, "time": "2026-01-01T12:01:00Z"}
    return json.dumps(body)


def test_goodput_is_useful_time_over_wall_time() -> None:
    assert goodput_percent(50.0, START, START + timedelta(seconds=100)) == 50.0
    assert goodput_percent(1.0, START, START + timedelta(seconds=3)) == 33.3
    assert goodput_percent(200.0, START, START + timedelta(seconds=100)) == 100.0  # clamped
    assert goodput_percent(None, START, START + timedelta(seconds=1)) is None
    assert goodput_percent(1.0, START, START) is None


def test_malformed_reports_read_as_absent_or_partial() -> None:
    assert parse_report("not json") is None
    assert parse_report("[1, 2]") is None
    assert parse_report('{"v": 2, "step": 3}') is None
    partial = parse_report('{"step": true, "restarts": {"inJob": -4}, "stepTimeSeconds": "fast"}')
    assert partial is not None
    assert (partial.step, partial.in_job_restarts, partial.step_time_seconds) == (0, 0, None)


def test_fold_takes_the_lead_pod_and_newest_checkpoint() -> None:
    reports = [
        ("a", parse_report(report(120, checkpoint=100, in_job=1))),
        ("b", parse_report(report(118, checkpoint=50, in_process=2, useful=40.0))),
    ]
    folded = fold_progress({}, [(uid, r) for uid, r in reports if r], {})
    assert folded.progress == {
        "step": 120,
        "stepTimeSeconds": 0.25,
        "goodputPercent": 50.0,
        "updateTime": "2026-01-01T12:01:40Z",
        # The first step ever reported is an advance, at the lead report's time when no `now` is given.
        "currentStep": 120,
        "lastAdvanceTime": "2026-01-01T12:01:40Z",
    }
    assert folded.advanced
    assert folded.last_checkpoint == {"step": 100, "time": "2026-01-01T12:01:00Z"}
    assert (folded.in_process_restarts, folded.in_job_restarts) == (2, 1)


def test_restart_counts_never_decrease_and_keep_counting_after_replacement() -> None:
    status = {"restarts": {"inProcess": 0, "inJob": 3}}
    old = parse_report(report(10, in_job=3))
    assert old is not None
    first = fold_progress(status, [("old", old)], {})
    assert first.in_job_restarts == 3
    # The pod is replaced: the new one counts from 0, its first fold must not lose the 3.
    new = parse_report(report(11, in_job=0))
    assert new is not None
    second = fold_progress({"restarts": {"inJob": 3}}, [("new", new)], first.offsets)
    assert second.in_job_restarts == 3 and second.offsets["new"] == RestartOffset(in_process=0, in_job=3)
    later = parse_report(report(12, in_job=2))
    assert later is not None
    third = fold_progress({"restarts": {"inJob": 3}}, [("new", later)], second.offsets)
    assert third.in_job_restarts == 5


def test_fresh_operator_does_not_recount_what_status_holds() -> None:
    survivor = parse_report(report(50, in_job=4))
    assert survivor is not None
    folded = fold_progress({"restarts": {"inJob": 4}}, [("pod", survivor)], {})
    assert folded.in_job_restarts == 4


def test_progress_reports_reach_status_through_reconcile() -> None:
    world = World.with_nodes(job_body(nodes=2), 3)
    world.settle()
    for i, text in enumerate([report(200, checkpoint=200, in_job=1), report(199, in_process=1)]):
        pod = world.pod(constants.ROLE_WORKER, i)
        parsed = parse_report(text)
        assert pod is not None and parsed is not None
        world.reports[pod["metadata"]["uid"]] = parsed
    world.reconcile()
    status = world.status()
    assert status["progress"]["step"] == 200 and status["progress"]["goodputPercent"] == 50.0
    assert status["lastCheckpoint"]["step"] == 200
    assert status["restarts"] == {"inProcess": 1, "inJob": 1, "podReplacement": 0, "total": 2}
    # Reports that do not change leave status alone: no write.
    assert not world.reconcile().status_changed


def test_the_trainers_report_carries_what_stall_detection_and_the_advice_read() -> None:
    from rtj_trainer.progress import Progress, progress_json

    trainer = Progress(node_rank=0, train_start_time=1767268800.0, step=57)
    trainer.step_time_seconds, trainer.checkpoint_blocking_seconds = 0.5, 1.25
    parsed = parse_report(json.dumps(progress_json(trainer, 1767268900.0)))
    assert parsed is not None
    assert (parsed.step, parsed.step_time_seconds, parsed.checkpoint_blocking_seconds) == (57, 0.5, 1.25)
    assert parsed.train_start_time is not None and parsed.time is not None
    assert (parsed.time - parsed.train_start_time).total_seconds() == 100


def test_a_step_that_falls_after_a_restart_is_the_new_base_not_an_advance() -> None:
    at = START + timedelta(seconds=300)
    status = {"progress": {"step": 120, "currentStep": 120, "lastAdvanceTime": "2026-01-01T12:01:40Z"}}
    restored = parse_report(report(100, at=300))
    assert restored is not None
    folded = fold_progress(status, [("new", restored)], {}, at)
    assert not folded.advanced
    assert folded.progress is not None
    # status.progress.step keeps the highest step seen; currentStep is where training is now.
    assert (folded.progress["step"], folded.progress["currentStep"]) == (120, 100)
    assert folded.progress["lastAdvanceTime"] == "2026-01-01T12:01:40Z"
    redone = parse_report(report(101, at=301))
    assert redone is not None
    again = fold_progress({"progress": folded.progress}, [("new", redone)], {}, at)
    assert again.advanced and again.progress is not None
    assert again.progress["currentStep"] == 101
    assert again.progress["lastAdvanceTime"] == "2026-01-01T12:05:00Z"


def test_a_pod_being_deleted_does_not_hold_the_current_step_up() -> None:
    at = START + timedelta(seconds=300)
    status = {"progress": {"step": 120, "currentStep": 120}}
    stale, fresh = parse_report(report(120, at=200)), parse_report(report(101, at=300))
    assert stale is not None and fresh is not None
    folded = fold_progress(status, [("old", stale), ("new", fresh)], {}, at, leaving={"old"})
    assert folded.progress is not None and folded.progress["currentStep"] == 101
    # Its report still counts for the highest step seen.
    assert folded.progress["step"] == 120


def test_a_fallen_step_above_the_checkpoint_is_training_again() -> None:
    """A restarted trainer reports a step once it completed it: above the checkpoint it resumed from,
    the first report after a restart already shows training."""
    at = START + timedelta(seconds=300)
    status = {
        "progress": {"step": 120, "currentStep": 120, "lastAdvanceTime": "2026-01-01T12:01:40Z"},
        "lastCheckpoint": {"step": 100},
    }
    restored, trained = parse_report(report(100, at=300)), parse_report(report(103, at=300))
    assert restored is not None and trained is not None
    assert not fold_progress(status, [("new", restored)], {}, at).advanced
    folded = fold_progress(status, [("new", trained)], {}, at)
    assert folded.advanced and folded.progress is not None
    assert (
        folded.progress["currentStep"] == 103 and folded.progress["lastAdvanceTime"] == "2026-01-01T12:05:00Z"
    )
