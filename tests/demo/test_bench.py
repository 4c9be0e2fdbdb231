"""`rtj bench`: the goodput table and the checkpoint benchmark on a tiny state (real saves)."""

import json
from pathlib import Path

import pytest
from rtj_demo import bench, ckptbench
from rtj_demo.rehearsal import JobResult
from rtj_demo.report import CheckpointRecord, FaultRecord, RecoveryRecord, StepRecord
from rtj_demo.timeline import Timeline


def test_goodput_plan_is_five_faults_in_step_order() -> None:
    plan = bench.goodput_plan(300)
    assert [f.kind for f in plan] == ["exception", "sigkill", "hang", "exception", "node-loss"]
    assert [f.step for f in plan] == sorted({f.step for f in plan})


def test_goodput_table_lists_seconds_per_fault_and_goodput() -> None:
    steps = [StepRecord(float(i), i, seconds=1.0) for i in range(1, 11)]
    steps += [StepRecord(20.0 + i, 10 + i, seconds=1.0) for i in range(1, 11)]
    timeline = Timeline(
        steps=steps,
        faults=[FaultRecord(10.5, "sigkill", step=10)],
        recoveries=[RecoveryRecord(15.0, "in-job")],
        checkpoints=[CheckpointRecord(5.0, 5)],
        start_time=0.0,
    )
    result = JobResult("b", "Succeeded", timeline, {}, [], True)
    table = bench.goodput_table([(bench.MODES["ft-launcher"], result, timeline.report())])
    header, _, row, layers = table.splitlines()
    assert "sigkill" in header and "goodput" in header
    assert row.startswith("ft-launcher (async)")
    assert "10.5" in row  # 21.0 - 10.5 s to the first step after the fault
    assert "66.7%" in row  # 20 useful seconds of 30
    assert "sigkill: in-job" in layers


def test_unknown_benchmark_is_an_error() -> None:
    assert bench.main(["nope"]) == 2
    assert bench.main([]) == 2


@pytest.mark.slow
def test_checkpoint_benchmark_runs_sync_and_async_saves(tmp_path: Path) -> None:
    results = ckptbench.run([4], [3], step_seconds=0.001, saves_per_run=2, log=lambda _: None)
    modes = {r.mode: r for r in results}
    assert set(modes) == {"none", "Sync", "Async"}
    assert modes["none"].saves == 0
    assert modes["Sync"].saves == modes["Async"].saves == 2
    # Sync saves always write; an async save point either writes or is skipped (its writer busy).
    assert (modes["Sync"].saves_written, modes["Sync"].saves_skipped) == (2, 0)
    assert modes["Async"].saves_written + modes["Async"].saves_skipped == 2
    assert modes["Async"].saves_written >= 1
    assert all(r.durable_lag_max_steps >= 3 for r in (modes["Sync"], modes["Async"]))
    assert all(0 < r.efficiency <= 1 for r in results)
    assert modes["Sync"].blocking_mean_seconds > 0 and modes["Async"].blocking_mean_seconds > 0
    assert "4 MiB" in ckptbench.format_table(results)
    assert (
        bench.main(["checkpoint", "--sizes", "4", "--intervals", "3", "--saves", "1", "--out", str(tmp_path)])
        == 0
    )
    (written,) = tmp_path.glob("checkpoint-*.json")
    data = json.loads(written.read_text())
    assert data["benchmark"] == "checkpoint" and len(data["results"]) == 3
    assert len(data["load_average"]) == 3
