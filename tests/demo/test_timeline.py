"""Turning the components' records into a timeline, the plot file, the live line and the process tag."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rtj_demo import processes
from rtj_demo.live import LiveLine, Snapshot, format_line
from rtj_demo.plot import plot_runs, plot_timeline
from rtj_demo.report import (
    LAYER_IN_JOB,
    LAYER_IN_PROCESS,
    LAYER_JOB_RESTART,
    LAYER_POD_REPLACEMENT,
    CheckpointRecord,
    FaultRecord,
    RecoveryRecord,
    StepRecord,
    build_report,
)
from rtj_demo.timeline import (
    Timeline,
    align_fault_times,
    faults_from_markers,
    from_progress_records,
    read_json_lines,
    record_epoch_seconds,
    recoveries_from_events,
)


def _iso(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def test_parse_time_accepts_rfc3339_variants() -> None:
    assert record_epoch_seconds("1970-01-01T00:00:10Z") == 10.0
    assert record_epoch_seconds("1970-01-01T00:00:10.250000+00:00") == 10.25
    assert record_epoch_seconds(12) == 12.0
    assert record_epoch_seconds(None) is None
    assert record_epoch_seconds("not a time") is None


def test_progress_records_give_steps_checkpoints_and_trainer_recoveries() -> None:
    base = 1_000_000.0
    event = {"time": _iso(base + 3.5), "kind": "InProcessRestart", "step": 3, "recoveredEpoch": base + 3.5}
    records = [
        {"v": 1, "time": _iso(base + 1), "nodeRank": 0, "step": 1, "events": []},
        {"v": 1, "time": _iso(base + 2), "nodeRank": 0, "step": 2,
         "lastCheckpoint": {"step": 2, "time": _iso(base + 2.2)}},
        # node 1 reports the same checkpoint later: the first report's time is kept.
        {"v": 1, "time": _iso(base + 2.5), "nodeRank": 1, "step": 2,
         "lastCheckpoint": {"step": 2, "time": _iso(base + 2.4)}},
        {"v": 1, "time": _iso(base + 4), "nodeRank": 0, "step": 3, "events": [event]},
        # a report forced by a checkpoint commit repeats node 0's step: not a new step.
        {"v": 1, "time": _iso(base + 4.1), "nodeRank": 0, "step": 3,
         "lastCheckpoint": {"step": 3, "time": _iso(base + 4.05)}},
        # the same event repeated in the next record, and an in-job restart.
        {"v": 1, "time": _iso(base + 9), "nodeRank": 1, "step": 3,
         "events": [event, {"time": _iso(base + 8), "kind": "InJobRestart", "step": 3}]},
    ]  # fmt: skip
    timeline = from_progress_records(records)
    # steps come from node 0 only (node 1 steps in lockstep with it).
    assert [(s.step, s.time - base) for s in timeline.steps] == [(1, 1), (2, 2), (3, 4)]
    assert [(c.step, c.time - base) for c in timeline.checkpoints] == [
        (2, pytest.approx(2.2)),
        (3, pytest.approx(4.05)),
    ]
    assert [(r.layer, r.time - base) for r in timeline.recoveries] == [
        (LAYER_IN_PROCESS, 3.5),
        (LAYER_IN_JOB, 8.0),
    ]


def test_json_lines_skip_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "ti', encoding="utf-8")
    assert read_json_lines(path) == [{"step": 1}, {"step": 2}]
    assert read_json_lines(tmp_path / "missing.jsonl") == []


def test_fault_markers_count_each_fault_once(tmp_path: Path) -> None:
    marker_dir = tmp_path / "faults-fired"
    marker_dir.mkdir()
    for rank, when in ((0, 10.2), (1, 10.1)):
        (marker_dir / f"fault-0-step-5-rank-{rank}.json").write_text(
            json.dumps({"kind": "exception", "step": 5, "rank": rank, "time": when})
        )
    (marker_dir / "fault-1-step-9-rank-1.json").write_text(
        json.dumps({"kind": "sigkill", "step": 9, "rank": 1, "time": 20.0})
    )
    (marker_dir / "fault-2-step-12-rank-1.json").write_text("{torn")
    faults = faults_from_markers(marker_dir)
    assert [(f.kind, f.time, f.step) for f in faults] == [("exception", 10.1, 5), ("sigkill", 20.0, 9)]
    assert faults_from_markers(tmp_path / "absent") == []


def test_fault_time_moves_past_rank_zeros_lagging_report() -> None:
    # rank 1 fires at the start of step index 20 (20 steps done) at t=10.000, while rank 0 reports
    # step 20 at t=10.002 (it was saving a checkpoint); training resumes with step 21 at t=11.2.
    steps = [StepRecord(9.9, 19), StepRecord(10.002, 20), StepRecord(11.2, 21), StepRecord(11.3, 22)]
    faults = [FaultRecord(10.0, "exception", step=20), FaultRecord(11.25, "sigkill")]
    aligned = align_fault_times(steps, faults)
    assert [f.time for f in aligned] == [10.002, 11.25]
    report = build_report(steps, aligned, [RecoveryRecord(11.1, LAYER_IN_PROCESS)], [])
    exception = report.faults[0]
    assert exception.recovered_by == LAYER_IN_PROCESS
    assert exception.recovery_seconds == pytest.approx(11.2 - 10.002)
    assert exception.step_at_fault == 20
    # A report beyond the lag window, or of a later step, is left alone.
    assert align_fault_times([StepRecord(13.0, 20)], [FaultRecord(10.0, "hang", step=20)])[0].time == 10.0
    assert align_fault_times([StepRecord(10.1, 21)], [FaultRecord(10.0, "hang", step=20)])[0].time == 10.0


def test_a_lost_nodes_in_flight_steps_are_not_its_recovery() -> None:
    # The node dies at t=10.0 while rank 0 finishes step 21 (reported at 10.08); the job resumes at
    # step 20 at t=30 after the replacement.
    steps = [StepRecord(9.8, 20), StepRecord(10.08, 21), StepRecord(30.0, 20), StepRecord(30.2, 21)]
    (aligned,) = align_fault_times(steps, [FaultRecord(10.0, "node-loss")])
    assert aligned.time == 10.08
    report = build_report(steps, [aligned], [RecoveryRecord(15.0, LAYER_POD_REPLACEMENT)], [])
    (fault,) = report.faults
    assert fault.recovered_by == LAYER_POD_REPLACEMENT
    assert fault.recovery_seconds == pytest.approx(30.0 - 10.08)
    assert fault.steps_lost == 2


def test_steps_in_flight_while_a_slow_kill_goes_on_are_not_its_recovery() -> None:
    # On a loaded machine killing the node's processes took 0.8 s (10.0 to 10.8); rank 0 still reported
    # steps 21 and 22 in that time and 0.2 s after it. The recovery is the step after the restart.
    steps = [StepRecord(9.8, 20), StepRecord(10.5, 21), StepRecord(11.0, 22), StepRecord(14.0, 21)]
    (aligned,) = align_fault_times(steps, [FaultRecord(10.0, "node-loss", killed_by=10.8)])
    assert aligned.time == 11.0
    report = build_report(steps, [aligned], [RecoveryRecord(12.0, LAYER_IN_PROCESS)], [])
    assert report.faults[0].recovered_by == LAYER_IN_PROCESS
    assert report.faults[0].recovery_seconds == pytest.approx(3.0)


def test_a_lost_nodes_in_process_recovery_two_seconds_later_is_its_recovery() -> None:
    # Under the Supervisor launcher the survivors and a spare go on from memory 2.1 s after the kill:
    # that step is the recovery, not a step in flight.
    steps = [StepRecord(9.8, 20), StepRecord(12.1, 21), StepRecord(12.4, 22)]
    (aligned,) = align_fault_times(steps, [FaultRecord(10.0, "node-loss")])
    assert aligned.time == 10.0
    report = build_report(steps, [aligned], [RecoveryRecord(11.0, LAYER_IN_PROCESS)], [])
    assert report.faults[0].recovered_by == LAYER_IN_PROCESS
    assert report.faults[0].recovery_seconds == pytest.approx(2.1)


def test_trainer_events_act_between_fault_and_recovery() -> None:
    base = 5_000.0
    # node 1 records the in-process restart 4 ms after node 0 reported the first step after it.
    records = [
        {"time": _iso(base + 1.0), "nodeRank": 0, "step": 62},
        {"time": _iso(base + 2.143), "nodeRank": 0, "step": 63},
        {"time": _iso(base + 2.15), "nodeRank": 1, "step": 63, "events": [
            {"kind": "InProcessRestart", "faultEpoch": base + 1.0, "recoveredEpoch": base + 2.147}
        ]},
    ]  # fmt: skip
    timeline = from_progress_records(records)
    assert [r.time - base for r in timeline.recoveries] == [pytest.approx((1.0 + 2.147) / 2)]
    timeline.faults = [FaultRecord(base + 1.0, "exception", step=62)]
    (fault,) = timeline.report().faults
    assert fault.recovered_by == LAYER_IN_PROCESS


def test_operator_events_give_pod_replacements_and_gang_restarts() -> None:
    events = [
        {"reason": "NodeLost", "eventTime": "1970-01-01T00:00:05.000000Z"},
        {"reason": "WorkerReplaced", "eventTime": "1970-01-01T00:00:06.500000Z"},
        {"reason": "GangRestart", "eventTime": None, "lastTimestamp": "1970-01-01T00:00:09Z"},
    ]
    assert [(r.layer, r.time) for r in recoveries_from_events(events)] == [
        (LAYER_POD_REPLACEMENT, 6.5),
        (LAYER_JOB_RESTART, 9.0),
    ]


def _sample_timeline() -> Timeline:
    base = 100.0
    timeline = from_progress_records(
        [{"time": _iso(base + i * 0.5), "step": i} for i in range(1, 21)]
        + [{"time": _iso(base + 15 + i * 0.5), "step": i} for i in range(16, 31)]
    )
    timeline.faults = faults_from_markers(Path("/nonexistent"))
    timeline.faults.append(FaultRecord(time=base + 10.2, kind="sigkill"))
    timeline.recoveries.append(RecoveryRecord(time=base + 12.0, layer=LAYER_IN_JOB))
    timeline.checkpoints.append(CheckpointRecord(time=base + 7.6, step=15))
    timeline.start_time = base
    return timeline


def test_timeline_json_round_trip_and_report() -> None:
    timeline = _sample_timeline()
    again = Timeline.from_json(json.loads(json.dumps(timeline.to_json())))
    assert again == timeline
    report = again.report()
    (fault,) = report.faults
    assert fault.recovered_by == LAYER_IN_JOB
    assert fault.steps_lost == 5
    assert fault.recovery_seconds == pytest.approx(15 + 8 - 10.2)


def test_plot_files_are_written(tmp_path: Path) -> None:
    timeline = _sample_timeline()
    report = timeline.report()
    one = plot_timeline(timeline, report, tmp_path / "one" / "timeline.png", title="demo")
    assert one.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    both = plot_runs([("a", timeline, report), ("b", timeline, None)], tmp_path / "both.png")
    assert both.stat().st_size > one.stat().st_size / 2
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_runs([], tmp_path / "none.png")


def test_live_line_prints_changes_and_periodic_lines_when_not_a_tty() -> None:
    out = io.StringIO()
    live = LiveLine(out, interval=3600)
    snap = Snapshot(step=10, total=100, state="Running", restarts={"in-process": 0})
    live.update(snap)
    live.update(Snapshot(step=11, total=100, state="Running", restarts={"in-process": 0}))  # no change
    live.update(Snapshot(step=12, total=100, state="Running", restarts={"in-process": 1}))
    live.note("fault: node killed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "step 10/100" in lines[0] and "in-process 0" in lines[0]
    assert "in-process 1" in lines[1]
    assert lines[2] == "fault: node killed"
    assert format_line(Snapshot(step=50, total=100)).startswith("[" + "#" * 10 + "." * 10 + "]")


def test_tagged_processes_find_descendants_even_when_orphaned() -> None:
    run_id = processes.tag_environment()
    try:
        # The child starts a grandchild and exits at once: the grandchild is re-parented, yet found.
        code = (
            "import subprocess, sys; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        found = processes.tagged_processes(run_id)
        assert len(found) == 1
        assert "time.sleep(60)" in processes.describe(found)
        killed = processes.reap(run_id, timeout=0.5)
        assert [p.pid for p in killed] == [p.pid for p in found]
        assert processes.tagged_processes(run_id) == []
    finally:
        os.environ.pop(processes.RUN_TAG, None)


def test_steps_go_on_from_the_node_that_took_over_a_lost_worker_0s_share() -> None:
    """Under the Supervisor launcher a hot spare's pod (node rank 2 here) goes on with worker 0's
    share once worker 0's node is lost, in lockstep with worker 1: the steps go on from the lowest
    node that went on past node 0's last step, and node 0's replacement standing by reports none."""
    base = 1_700_000_000.0
    records = [
        {"time": _iso(base + 1), "nodeRank": 0, "step": 10},
        {"time": _iso(base + 1.01), "nodeRank": 1, "step": 10},
        {"time": _iso(base + 2), "nodeRank": 0, "step": 11},
        {"time": _iso(base + 2.01), "nodeRank": 1, "step": 11},
        {"time": _iso(base + 6), "nodeRank": 2, "step": 12},
        {"time": _iso(base + 6.01), "nodeRank": 1, "step": 12},
        {"time": _iso(base + 7), "nodeRank": 0, "step": 0},
        {"time": _iso(base + 7.5), "nodeRank": 2, "step": 13},
        {"time": _iso(base + 7.51), "nodeRank": 1, "step": 13},
    ]
    steps = from_progress_records(records).steps
    assert [(round(s.time - base, 2), s.step) for s in steps] == [(1, 10), (2, 11), (6.01, 12), (7.51, 13)]


def test_the_other_nodes_last_reports_after_node_0s_are_not_steps() -> None:
    base = 1_700_000_000.0
    records = [
        {"time": _iso(base + 1), "nodeRank": 0, "step": 20},
        {"time": _iso(base + 1.02), "nodeRank": 1, "step": 19},
        {"time": _iso(base + 1.03), "nodeRank": 1, "step": 20},
    ]
    assert [s.step for s in from_progress_records(records).steps] == [20]


def test_the_trainers_checkpoint_blocking_is_its_largest_count_and_survives_json() -> None:
    base = 1_700_000_000.0
    records = [
        {"time": _iso(base + 1), "nodeRank": 0, "step": 1, "checkpointBlockingSeconds": 0.25},
        {"time": _iso(base + 2), "nodeRank": 0, "step": 2, "checkpointBlockingSeconds": 0.75},
        {"time": _iso(base + 2.1), "nodeRank": 1, "step": 2, "checkpointBlockingSeconds": 9.0},
    ]
    timeline = from_progress_records(records)
    assert timeline.checkpoint_blocking_seconds == 0.75  # node 0's: the step source's count
    assert Timeline.from_json(timeline.to_json()).checkpoint_blocking_seconds == 0.75
    assert from_progress_records(records[:0]).checkpoint_blocking_seconds is None
