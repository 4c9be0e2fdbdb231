"""The progress fold and goodput arithmetic: fixed inputs, expected figures."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from operator_world import World, job_body
from rtj_operator import constants
from rtj_operator.api.status import RestartsSource, StepSource
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
    **extra: object,
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
    return json.dumps(body | extra)


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
    reports = [
        report(200, checkpoint=200, in_job=1, samples=12800, tokens=1638400, tokensPerSecond=4096.0),
        report(199, in_process=1, samples=12736, tokens=1630208, tokensPerSecond=4000.0),
    ]
    for i, text in enumerate(reports):
        pod = world.pod(constants.ROLE_WORKER, i)
        parsed = parse_report(text)
        assert pod is not None and parsed is not None
        world.reports[pod["metadata"]["uid"]] = parsed
    world.reconcile()
    status = world.status()
    assert status["progress"]["step"] == 200 and status["progress"]["goodputPercent"] == 50.0
    # The lead report's counts are the job's (each report counts the whole job's work).
    assert (status["progress"]["samples"], status["progress"]["tokens"]) == (12800, 1638400)
    assert status["progress"]["tokensPerSecond"] == 4096.0 and "samplesPerSecond" not in status["progress"]
    assert status["lastCheckpoint"]["step"] == 200
    assert status["restarts"] == {"inProcess": 1, "inJob": 1, "podReplacement": 0, "total": 2}
    # Reports that do not change leave status alone: no write.
    assert not world.reconcile().status_changed


def test_the_trainers_report_carries_what_stall_detection_and_the_advice_read() -> None:
    from rtj_trainer.library.progress import Progress, progress_json

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


# -- reports of a script of one's own: sources, ranks, library (rtj-launch's launcher view) --


def launcher_report(
    *,
    step: int | None = None,
    step_source: str = "NotReported",
    in_job: int = 0,
    at: int = 100,
    **extra: object,
) -> str:
    """A report rtj-launch serves without the library's: its ranks, and a step only from a log pattern."""
    body: dict[str, object] = {
        "v": 1,
        "time": (START + timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nodeRank": 0,
        "restarts": {"inProcess": 0, "inJob": in_job},
        "finished": False,
        "trainStartTime": START.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ranks": {"running": 2, "startTime": "2026-01-01T12:00:30.5Z", "restartCount": in_job},
        "sources": {"step": step_source, "restarts": "Launcher"},
        **extra,
    }
    if step is not None:
        body["step"] = step
    return json.dumps(body)


def test_the_launcher_view_is_parsed_and_bad_fields_read_as_absent() -> None:
    parsed = parse_report(launcher_report(library="0.1.0"))
    assert parsed is not None
    assert (parsed.step_source, parsed.restarts_source) == (StepSource.NOT_REPORTED, RestartsSource.LAUNCHER)
    assert not parsed.has_step and not parsed.reports_steps
    assert parsed.library == "0.1.0"
    assert parsed.ranks is not None and parsed.ranks.running == 2 and parsed.ranks.restart_count == 0
    assert parsed.ranks.start_time == START + timedelta(seconds=30.5)
    bad = parse_report(
        launcher_report(
            sources={"step": "Guessed", "restarts": 3}, ranks={"running": -1}, library=7, events=[{"kind": 1}]
        )
    )
    assert bad is not None
    assert (bad.step_source, bad.restarts_source, bad.ranks, bad.library, bad.last_recovery) == (
        None,
        None,
        None,
        None,
        None,
    )
    # A report without sources is the library's, from before rtj-launch named them: its step counts.
    legacy = parse_report(report(5))
    assert legacy is not None and legacy.has_step and legacy.reports_steps and legacy.step_source is None


def test_a_pattern_without_a_match_reports_steps_but_gives_none() -> None:
    waiting = parse_report(launcher_report(step_source="LogPattern"))
    matched = parse_report(launcher_report(step=7, step_source="LogPattern"))
    assert waiting is not None and matched is not None
    assert waiting.reports_steps and not waiting.has_step
    assert matched.reports_steps and matched.has_step and matched.step == 7


def test_the_newest_recovery_event_is_kept() -> None:
    events = [
        {"time": "2026-01-01T12:01:00Z", "kind": "InJobRestart", "faultTime": "2026-01-01T12:00:50Z",
         "recoverySeconds": 10.0, "step": None},
        {"time": "2026-01-01T12:03:00Z", "kind": "InJobRestart", "faultTime": "2026-01-01T12:02:48Z",
         "recoverySeconds": 12.0, "step": 40},
        {"time": "not a time", "kind": "InJobRestart"},
    ]  # fmt: skip
    parsed = parse_report(launcher_report(events=events))
    assert parsed is not None and parsed.last_recovery is not None
    newest = parsed.last_recovery
    assert (newest.kind, newest.recovery_seconds, newest.step) == ("InJobRestart", 12.0, 40)
    assert newest.fault_time == START + timedelta(seconds=168)


def test_reports_without_a_step_feed_the_restarts_and_sources_but_no_step() -> None:
    reports = [(uid, parse_report(launcher_report(in_job=2))) for uid in ("a", "b")]
    folded = fold_progress({}, [(uid, r) for uid, r in reports if r], {}, START)
    assert folded.progress == {"sources": {"step": "NotReported", "restarts": "Launcher"}}
    assert not folded.advanced and folded.in_job_restarts == 2
    # Where the library reports on one worker, the job's step and restarts are the library's.
    with_library = {**json.loads(report(12)), "library": "0.1.0"}
    library = parse_report(
        json.dumps({**with_library, "sources": {"step": "Library", "restarts": "Library"}})
    )
    pattern = parse_report(launcher_report(step=3, step_source="LogPattern"))
    assert library is not None and pattern is not None
    mixed = fold_progress({}, [("a", pattern), ("b", library)], {}, START)
    assert mixed.progress is not None
    assert mixed.progress["sources"] == {"step": "Library", "restarts": "Library"}
    assert mixed.progress["library"] == "0.1.0" and mixed.progress["currentStep"] == 12
    # Reports that say nothing of their sources keep what status says.
    legacy = parse_report(report(13))
    assert legacy is not None
    kept = fold_progress({"progress": mixed.progress}, [("b", legacy)], {}, START)
    assert kept.progress is not None and kept.progress["sources"] == mixed.progress["sources"]
    assert kept.progress["library"] == "0.1.0"


def test_samples_and_tokens_are_the_lead_reports_and_absent_unless_reported() -> None:
    lead = parse_report(
        report(120, samples=7680, tokens=983040, samplesPerSecond=256.004, tokensPerSecond=32768.5)
    )
    behind = parse_report(report(118, samples=7552, tokens=966656, samplesPerSecond=300.0))
    assert lead is not None and behind is not None
    folded = fold_progress({}, [("a", behind), ("b", lead)], {})
    assert folded.progress is not None
    work = {k: folded.progress[k] for k in ("samples", "tokens", "samplesPerSecond", "tokensPerSecond")}
    # Not a sum over pods: every node's report counts the whole job's samples.
    assert work == {"samples": 7680, "tokens": 983040, "samplesPerSecond": 256.0, "tokensPerSecond": 32768.5}
    # A report without them (a script that passes none, or a library before 0.2.0) shows none.
    older = parse_report(report(121))
    assert older is not None and (older.samples, older.tokens, older.samples_per_second) == (None, None, None)
    later = fold_progress({"progress": folded.progress}, [("b", older)], {})
    assert later.progress is not None and later.progress["step"] == 121
    assert not {"samples", "tokens", "samplesPerSecond", "tokensPerSecond"} & later.progress.keys()


def test_malformed_samples_and_tokens_read_as_absent() -> None:
    for bad in (-1, 1.5, True, "7680", None, [1]):
        parsed = parse_report(report(5, samples=bad, tokens=bad, samplesPerSecond=bad, tokensPerSecond=-2.0))
        assert parsed is not None and parsed.step == 5
        assert (parsed.samples, parsed.tokens, parsed.tokens_per_second) == (None, None, None), bad
        assert parsed.samples_per_second == (1.5 if bad == 1.5 else None), bad


def test_the_trainers_samples_and_tokens_reach_status() -> None:
    from rtj_trainer.library.progress import Progress, progress_json

    trainer = Progress(node_rank=1, train_start_time=1767268800.0, step=2)
    trainer.count_work(0.5, samples=64, tokens=8192)
    trainer.count_work(1.5, samples=64, tokens=8192)
    parsed = parse_report(json.dumps(progress_json(trainer, 1767268900.0)))
    assert parsed is not None
    assert (parsed.samples, parsed.tokens) == (128, 16384)
    assert (parsed.samples_per_second, parsed.tokens_per_second) == (64.0, 8192.0)  # 128 over 2 s
    folded = fold_progress({}, [("a", parsed)], {})
    assert folded.progress is not None and folded.progress["tokensPerSecond"] == 8192.0
