"""The report math (goodput, lost steps, recovery attribution) on fixed timelines."""

import pytest
from rtj_demo.report import (
    LAYER_IN_JOB,
    LAYER_IN_PROCESS,
    LAYER_POD_REPLACEMENT,
    CheckpointRecord,
    FaultRecord,
    RecoveryRecord,
    StepRecord,
    build_report,
    format_table,
    useful_step_seconds,
)


def _run(start_time: float, first_step: int, last_step: int, step_seconds: float = 1.0) -> list[StepRecord]:
    return [
        StepRecord(time=start_time + i * step_seconds, step=s)
        for i, s in enumerate(range(first_step, last_step + 1))
    ]


def _timeline() -> tuple[list[StepRecord], list[FaultRecord], list[RecoveryRecord], list[CheckpointRecord]]:
    # steps 1..10 at t=1..10; an exception at 10.5 recovered in-process (in-memory state, nothing lost);
    # step 11 at 11.5, steps 12..20 at 12.5..20.5; SIGKILL at 21.0; the newest complete checkpoint is
    # step 15, so training resumes at step 16 (t=28.0) and redoes 16..20; steps 17..25 at 29..37.
    steps = _run(1.0, 1, 10) + _run(11.5, 11, 20) + _run(28.0, 16, 25)
    faults = [FaultRecord(time=10.5, kind="exception"), FaultRecord(time=21.0, kind="sigkill")]
    recoveries = [
        RecoveryRecord(time=10.8, layer=LAYER_IN_PROCESS),
        RecoveryRecord(time=25.0, layer=LAYER_IN_JOB),
    ]
    checkpoints = [CheckpointRecord(time=5.2, step=5), CheckpointRecord(time=15.7, step=15)]
    return steps, faults, recoveries, checkpoints


def test_recovery_seconds_lost_steps_and_layers() -> None:
    report = build_report(*_timeline())
    exception, sigkill = report.faults
    assert exception.recovered_by == LAYER_IN_PROCESS
    assert exception.recovery_seconds == pytest.approx(1.0)
    assert exception.steps_lost == 0
    assert exception.as_intended
    assert sigkill.recovered_by == LAYER_IN_JOB
    assert sigkill.recovery_seconds == pytest.approx(7.0)
    assert sigkill.step_at_fault == 20
    assert sigkill.resumed_from_step == 15
    assert sigkill.steps_lost == 5
    assert report.all_recovered_as_intended


def test_goodput_counts_redone_steps_once() -> None:
    report = build_report(*_timeline())
    # 25 distinct steps of 1 s each are useful; wall runs from the first step's start (t=0) to t=37.
    assert report.useful_seconds == pytest.approx(25.0)
    assert report.wall_seconds == pytest.approx(37.0)
    assert report.training_goodput == pytest.approx(25.0 / 37.0)
    assert report.final_step == 25
    assert report.steps_computed == 30
    assert report.checkpoints == 2


def test_explicit_wall_window() -> None:
    report = build_report(*_timeline(), start_time=-3.0, end_time=40.0)
    assert report.wall_seconds == pytest.approx(43.0)
    assert report.training_goodput == pytest.approx(25.0 / 43.0)


def test_most_expensive_acting_layer_wins() -> None:
    # A node loss: survivors restart in-job, and the operator replaces the lost pod.
    steps = _run(1.0, 1, 10) + _run(30.0, 9, 12)
    faults = [FaultRecord(time=10.2, kind="node-loss")]
    recoveries = [
        RecoveryRecord(time=14.0, layer=LAYER_IN_JOB),
        RecoveryRecord(time=15.0, layer=LAYER_POD_REPLACEMENT),
        RecoveryRecord(time=31.0, layer=LAYER_IN_PROCESS),  # after the first new step: not this fault's
    ]
    (fault,) = build_report(steps, faults, recoveries, []).faults
    assert fault.recovered_by == LAYER_POD_REPLACEMENT
    assert fault.as_intended
    assert fault.steps_lost == 2
    assert fault.recovery_seconds == pytest.approx(19.8)


def test_unrecovered_fault_is_reported_as_such() -> None:
    steps = _run(1.0, 1, 5)
    faults = [FaultRecord(time=5.5, kind="hang")]
    report = build_report(steps, faults, [], [])
    (fault,) = report.faults
    assert fault.recovered_by is None
    assert fault.recovery_seconds is None
    assert fault.steps_lost is None
    assert not report.all_recovered_as_intended
    assert "(!)" in format_table(report)


def test_wrong_layer_is_flagged() -> None:
    steps = _run(1.0, 1, 5) + _run(20.0, 4, 6)
    faults = [FaultRecord(time=5.5, kind="exception")]
    recoveries = [RecoveryRecord(time=10.0, layer=LAYER_IN_JOB)]
    (fault,) = build_report(steps, faults, recoveries, []).faults
    assert fault.recovered_by == LAYER_IN_JOB
    assert not fault.as_intended


def test_useful_time_uses_measured_durations() -> None:
    steps = [StepRecord(0.0, 1), StepRecord(0.5, 2), StepRecord(1.5, 3), StepRecord(2.0, 4)]
    useful, median = useful_step_seconds(steps, [])
    assert median == pytest.approx(0.5)
    # step 1's own duration is unknown (start-up): counted at the median.
    assert useful == pytest.approx(0.5 + 0.5 + 1.0 + 0.5)


def test_empty_timeline_is_an_error() -> None:
    with pytest.raises(ValueError, match="no training step"):
        build_report([], [], [], [])


def test_json_round_trip_marks_intent() -> None:
    data = build_report(*_timeline()).to_json()
    assert data["all_recovered_as_intended"] is True
    assert [f["as_intended"] for f in data["faults"]] == [True, True]


def test_measured_step_seconds_exclude_saves_between_steps() -> None:
    # Step 3 is followed by a 2 s synchronous save: the gap to step 4 is 2.5 s, its compute 0.5 s.
    steps = [
        StepRecord(0.5, 1, seconds=0.5),
        StepRecord(1.0, 2, seconds=0.5),
        StepRecord(1.5, 3, seconds=0.5),
        StepRecord(4.0, 4, seconds=0.5),
    ]
    report = build_report(steps, [], [], [], start_time=0.0)
    assert report.useful_seconds == pytest.approx(2.0)
    assert report.training_goodput == pytest.approx(0.5)


def test_goodput_from_the_first_step_and_from_submission() -> None:
    # Submitted at t=-3: start-up runs to the first step's start (t=0, its completion at 1.0 minus the
    # median step of 1 s); wall time is 37 s from the first step and 40 s from submission.
    report = build_report(*_timeline(), start_time=-3.0)
    assert report.first_step_start == pytest.approx(0.0)
    assert report.startup_seconds == pytest.approx(3.0)
    assert report.wall_from_first_step_seconds == pytest.approx(37.0)
    assert report.goodput_from_first_step == pytest.approx(25.0 / 37.0)
    assert report.wall_seconds == pytest.approx(40.0)
    assert report.goodput_from_submission == pytest.approx(25.0 / 40.0)
    assert report.training_goodput == report.goodput_from_submission
    data = report.to_json()
    assert data["startup_seconds"] == pytest.approx(3.0)
    assert data["goodput_from_first_step"] == pytest.approx(25.0 / 37.0)
    assert data["seconds_per_fault"] == pytest.approx((1.0 + 7.0) / 2)
    assert data["steps_lost"] == 5
    text = format_table(report)
    assert "goodput from the first step: 67.6%" in text
    assert "goodput from submission: 62.5%" in text and "start-up 3.0 s" in text
    assert text.splitlines()[-1] == (
        "time not training, by cause: start-up 3.0 s, detection 4.0 s, restart 2.0 s, "
        "lost work 6.0 s, other 0.0 s"
    )


def test_without_a_submission_time_there_is_no_start_up() -> None:
    report = build_report(*_timeline())
    assert report.startup_seconds is None and report.goodput_from_submission is None
    assert report.training_goodput == report.goodput_from_first_step
    assert "from submission" not in format_table(report)


def test_the_first_step_starts_its_own_measured_time_before_it_ends() -> None:
    steps = [
        StepRecord(10.0, 1, seconds=0.25),
        StepRecord(11.0, 2, seconds=1.0),
        StepRecord(12.0, 3, seconds=1.0),
    ]
    report = build_report(steps, [], [], [], start_time=2.0)
    assert report.first_step_start == pytest.approx(9.75)
    assert report.startup_seconds == pytest.approx(7.75)
    assert report.wall_from_first_step_seconds == pytest.approx(2.25)
    assert report.goodput_from_first_step == pytest.approx(1.0)  # 2.25 useful of 2.25


def test_no_recovered_fault_means_no_seconds_per_fault() -> None:
    report = build_report(_run(1.0, 1, 5), [FaultRecord(time=5.5, kind="hang")], [], [])
    assert report.seconds_per_fault is None
    assert report.steps_lost == 0


def test_each_stall_splits_into_work_in_flight_detection_and_restart() -> None:
    report = build_report(*_timeline())
    exception, sigkill = report.faults
    # Step 10 at t=10, the exception at 10.5 (half a step in flight), step 11 began at 10.5 again:
    # the in-process layer (seen at 10.8) cost nothing more.
    assert (exception.in_flight_seconds, exception.detection_seconds, exception.restart_seconds) == (
        pytest.approx(0.5),
        pytest.approx(0.0),
        pytest.approx(0.0),
    )
    # Step 20 at 20.5, the SIGKILL at 21.0, ft_launcher acting at 25.0, the redone step 16 began at
    # 27.0: 0.5 in flight, 4.0 to detect, 2.0 to restart.
    assert (sigkill.in_flight_seconds, sigkill.detection_seconds, sigkill.restart_seconds) == (
        pytest.approx(0.5),
        pytest.approx(4.0),
        pytest.approx(2.0),
    )


def test_lost_time_by_cause_adds_up_to_what_was_not_useful() -> None:
    report = build_report(*_timeline(), start_time=-4.0, checkpoint_blocking_seconds=1.5)
    lost = report.lost_time()
    assert lost == {
        "start-up": pytest.approx(4.0),
        "detection": pytest.approx(4.0),
        "restart": pytest.approx(2.0),
        # Two steps' halves in flight and the five steps redone after the SIGKILL (16-20).
        "lost work": pytest.approx(6.0),
        "checkpoint blocking": pytest.approx(1.5),
        "other": pytest.approx(-1.5),  # the synthetic steps leave no room for the blocking
    }
    assert sum(v or 0.0 for v in lost.values()) == pytest.approx(report.wall_seconds - report.useful_seconds)
    assert report.to_json()["lost_time"] == lost
    # Without a submission time or a trainer's count, those two are unknown, not zero.
    bare = build_report(*_timeline()).lost_time()
    assert bare["start-up"] is None and bare["checkpoint blocking"] is None
    assert bare["other"] == pytest.approx(0.0)


def test_a_node_loss_that_interrupted_no_training_needs_no_layer_but_a_stall_does() -> None:
    # Steps every 0.2 s go on through the loss: the node's pod trained nothing.
    steps = [StepRecord(time=10.0 + 0.2 * i, step=50 + i) for i in range(20)]
    (fault,) = build_report(steps, [FaultRecord(time=11.05, kind="node-loss")], [], []).faults
    assert fault.recovered_by is None and fault.steps_lost == 0 and fault.interrupted_nothing
    assert fault.as_intended and "nothing to do" in format_table(
        build_report(steps, [FaultRecord(11.05, "node-loss")], [], [])
    )
    # The same loss followed by a 5 s stall and no layer acting is not recovered as intended.
    stalled = [*steps[:6], *(StepRecord(time=16.0 + 0.2 * i, step=56 + i) for i in range(5))]
    (fault,) = build_report(stalled, [FaultRecord(time=11.05, kind="node-loss")], [], []).faults
    assert fault.recovered_by is None and not fault.interrupted_nothing and not fault.as_intended
