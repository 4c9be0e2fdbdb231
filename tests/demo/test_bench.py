"""`rtj bench`: the goodput table and the checkpoint benchmark on a tiny state (real saves)."""

import json
from pathlib import Path

import pytest
from rtj_demo import bench, ckptbench
from rtj_demo.rehearsal import JobResult, PlannedFault, build_job, dropped_fields, load_example, merge_patch
from rtj_demo.report import CheckpointRecord, FaultRecord, RecoveryRecord, RunReport, StepRecord
from rtj_demo.timeline import Timeline


def test_goodput_plan_is_five_faults_in_step_order() -> None:
    plan = bench.goodput_plan(300)
    assert [f.kind for f in plan] == ["exception", "sigkill", "hang", "exception", "node-loss"]
    assert [f.step for f in plan] == sorted({f.step for f in plan})


def _run(mode: str = "ft-launcher") -> tuple[bench.Mode, JobResult, RunReport]:
    # Submitted at t=0, first step done at t=5 (4 s of start-up: each step takes 1 s), steps 1..10 at
    # t=5..14; a SIGKILL at 14.5; the workers resume from the step-5 checkpoint and finish steps 6..20
    # at t=20..34; a node lost at 34.5, steps 19..20 redone at t=40..41.
    steps = [StepRecord(4.0 + i, i, seconds=1.0) for i in range(1, 11)]
    steps += [StepRecord(14.0 + i, i, seconds=1.0) for i in range(6, 21)]
    steps += [StepRecord(21.0 + i, i, seconds=1.0) for i in range(19, 21)]
    timeline = Timeline(
        steps=steps,
        faults=[FaultRecord(14.5, "sigkill", step=10), FaultRecord(34.5, "node-loss")],
        recoveries=[RecoveryRecord(16.0, "in-job"), RecoveryRecord(37.0, "pod-replacement")],
        checkpoints=[CheckpointRecord(9.5, 5), CheckpointRecord(29.5, 15)],
        start_time=0.0,
    )
    result = JobResult("b", "Succeeded", timeline, {}, [], True)
    return bench.MODES[mode], result, timeline.report()


PLAN = [PlannedFault("sigkill", 10, rank=2), PlannedFault("node-loss", 20)]


def test_summary_row_puts_every_figure_of_a_mode_side_by_side() -> None:
    mode, result, report = _run()
    row = bench.summary_row(mode, result, report, PLAN)
    assert row["mode"] == "ft-launcher (async)"
    sigkill, node_loss = row["faults"]
    assert sigkill == {
        "kind": "sigkill",
        "step": 10,
        "recovery_seconds": pytest.approx(20.0 - 14.5),
        "recovered_by": "in-job",
        "steps_lost": 5,
    }
    assert node_loss["recovered_by"] == "pod-replacement"
    assert node_loss["recovery_seconds"] == pytest.approx(40.0 - 34.5)
    assert node_loss["steps_lost"] == 2
    assert row["seconds_per_fault"] == pytest.approx((5.5 + 5.5) / 2)
    assert row["steps_lost"] == 7
    # 20 distinct steps of 1 s are useful; the first step starts at t=4 and the last ends at t=41.
    assert row["startup_seconds"] == pytest.approx(4.0)
    assert row["wall_from_first_step_seconds"] == pytest.approx(37.0)
    assert row["goodput_from_first_step"] == pytest.approx(20.0 / 37.0)
    assert row["wall_from_submission_seconds"] == pytest.approx(41.0)
    assert row["goodput_from_submission"] == pytest.approx(20.0 / 41.0)
    json.dumps(row)  # goes into the results file as it is


def test_goodput_table_has_one_row_per_mode_with_all_figures() -> None:
    rows = [bench.summary_row(*_run(m), PLAN) for m in ("ft-launcher", "kubernetes-only")]
    header, rule, ft, k8s, legend = bench.goodput_table(rows, PLAN).splitlines()
    for column in (
        "sigkill@10",
        "node-loss@20",
        "s/fault",
        "steps lost",
        "goodput from 1st step",
        "goodput from submission",
        "start-up s",
    ):
        assert column in header
    assert set(rule) == {"-"}
    assert ft.startswith("ft-launcher (async)") and k8s.startswith("kubernetes-only (async)")
    assert "5.5 (in-job) 5 lost" in ft and "5.5 (pod-replacement) 2 lost" in ft
    assert ft.split()[-7:] == [
        "5.5",
        "7",
        "54.1%",
        "48.8%",
        "4.0",
        "-",
        "-",
    ]  # nothing without faults to compare with
    assert "steps lost" in legend
    markdown = bench.goodput_markdown(rows, PLAN).splitlines()
    assert markdown[0].startswith("| mode | sigkill @10 | node-loss @20 | s/fault |")
    assert markdown[2].startswith("| ft-launcher (async) | 5.5 (in-job) 5 lost |")
    assert len(markdown) == 4


def test_a_run_without_steps_keeps_its_row_with_why() -> None:
    mode, result, _ = _run()
    failed = JobResult("b", "Failed", Timeline(), {}, [], False, "BackoffLimitExceeded: too many failures")
    row = bench.summary_row(mode, failed, None, PLAN)
    assert row == {
        "mode": "ft-launcher (async)",
        "state": "Failed",
        "finished": False,
        "message": "BackoffLimitExceeded: too many failures",
        "faults": [],
    }
    table = bench.goodput_table([bench.summary_row(mode, result, result.timeline.report(), PLAN), row], PLAN)
    assert "ft-launcher (async): no steps recorded (Failed: BackoffLimitExceeded" in table
    assert "no steps recorded (Failed)" in bench.goodput_markdown([row], PLAN)


def test_a_fault_that_did_not_fire_is_blank_in_its_column() -> None:
    mode, result, report = _run()
    plan = [*PLAN, PlannedFault("hang", 30, rank=3)]
    row = bench.summary_row(mode, result, report, plan)
    assert row["faults"][2] == {
        "kind": "hang",
        "step": 30,
        "recovery_seconds": None,
        "recovered_by": None,
        "steps_lost": None,
    }
    assert "not recovered" in bench.goodput_table([row], plan)


def test_full_mode_comes_first_with_the_supervisor_patch() -> None:
    assert bench.DEFAULT_MODES[0] == "full"
    assert {"kubernetes-only", "plain-restart", "ft-launcher", "in-process+ft", "in-process+ft-sync"} <= set(
        bench.DEFAULT_MODES
    )
    full = bench.MODES["full"]
    settings = bench._settings(full, 0, 500, 0.15, bench.goodput_plan(500))
    spec = build_job(load_example(), settings, rendezvous_port=31000)["spec"]
    assert spec["faultTolerance"]["launcher"] == "Supervisor"
    assert spec["faultTolerance"]["inProcess"]["enabled"] is True
    assert spec["faultTolerance"]["heartbeatTimeoutSeconds"] == 10  # the example's own, kept
    assert spec["hotSpares"] == 2
    assert spec["checkpoint"]["memoryIntervalSteps"] == 1 and spec["checkpoint"]["mode"] == "Async"
    assert spec["checkpoint"]["intervalSteps"] == 25
    # 2 workers + 2 hot spares + the store pod.
    assert full.pods(2) == 5
    assert bench.MODES["kubernetes-only"].pods(2) == bench.MODES["plain-restart"].pods(2) == 2


def test_cluster_has_a_node_per_pod_and_per_loss_of_every_run_so_far() -> None:
    plan = bench.goodput_plan(500)  # one node loss
    modes = [bench.MODES[m] for m in bench.DEFAULT_MODES]
    # The sixth run finds five nodes lost before it and needs 2 + 1; one more is slack.
    assert bench.cluster_nodes(modes, plan, 2) == 5 + 3 + 1
    # Alone, the full mode needs its 5 pods and a replacement.
    assert bench.cluster_nodes([bench.MODES["full"]], plan, 2) == 5 + 1 + 1
    # The former four modes: as before.
    four = [bench.MODES[m] for m in ("plain-restart", "ft-launcher", "in-process+ft", "in-process+ft-sync")]
    assert bench.cluster_nodes(four, plan, 2) == 2 + len(four) + 1


def test_the_standby_mode_loses_a_training_pods_node_and_is_not_a_default() -> None:
    standby = bench.MODES["ft-launcher-standby"]
    assert "ft-launcher-standby" not in bench.DEFAULT_MODES  # it needs NVRx 0.7 in the pods
    settings = bench._settings(standby, 0, 500, 0.15, bench.goodput_plan(500))
    spec = build_job(load_example(), settings, rendezvous_port=31000)["spec"]
    assert spec["rendezvous"]["spares"] == "Standby" and spec["rendezvous"]["host"] == "StorePod"
    assert spec["hotSpares"] == 1 and spec["faultTolerance"]["inProcess"]["enabled"] is False
    assert [f.worker for f in settings.plan if f.kind == "node-loss"] == [None]
    assert standby.intended["node-loss"] == "in-job"
    # The other modes keep worker 1's node.
    other = bench._settings(bench.MODES["ft-launcher"], 0, 500, 0.15, bench.goodput_plan(500))
    assert [f.worker for f in other.plan if f.kind == "node-loss"] == [1]
    # 2 workers + the standby spare + the store pod.
    assert standby.pods(2) == 4


def test_only_the_kubernetes_only_run_gets_the_back_off_allowance() -> None:
    plan = bench.goodput_plan(500)
    assert bench.run_timeout(bench.MODES["full"], plan, 2, 900.0) == 900.0
    assert bench.run_timeout(bench.MODES["kubernetes-only"], plan, 2, 900.0) > 900.0 + 1600.0


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


def test_merge_patch_merges_mappings_and_removes_on_none() -> None:
    target = {"a": {"b": 1, "c": 2}, "d": [1], "e": 3}
    patched = merge_patch(target, {"a": {"b": 5, "c": None}, "d": [2], "f": {"g": 1}})
    assert patched == {"a": {"b": 5}, "d": [2], "e": 3, "f": {"g": 1}}
    assert target == {"a": {"b": 1, "c": 2}, "d": [1], "e": 3}  # unchanged


def test_dropped_fields_names_what_the_api_server_pruned() -> None:
    sent = {"hotSpares": 2, "faultTolerance": {"launcher": "Supervisor", "maxInJobRestarts": 3}}
    stored = {"hotSpares": 2, "faultTolerance": {"maxInJobRestarts": 3}}
    assert dropped_fields(sent, stored, "spec") == ["spec.faultTolerance.launcher"]
    assert dropped_fields(sent, sent) == []


def test_a_runs_json_keeps_the_summary_the_report_the_timeline_and_what_was_submitted() -> None:
    mode, result, report = _run("kubernetes-only")
    result.manifests = [{"kind": "Job", "metadata": {"name": "b"}}]
    result.timeline.recoveries.append(RecoveryRecord(16.5, "job-controller"))
    row = bench.summary_row(mode, result, report, PLAN)
    data = json.loads(json.dumps(bench._run_json(mode, result, report, row)))
    assert data["mode"] == "kubernetes-only" and data["runner"] == "indexed-job"
    assert data["summary"]["goodput_from_first_step"] == pytest.approx(report.goodput_from_first_step)
    assert data["report"]["startup_seconds"] == pytest.approx(4.0)
    assert len(data["timeline"]["steps"]) == len(result.timeline.steps)
    assert data["manifests"] == [{"kind": "Job", "metadata": {"name": "b"}}]
    assert data["pods_recreated_by_job_controller"] == 1


def _fault_free_report() -> RunReport:
    # The same 20 steps of 1 s without a fault: submitted at t=0, the first step done at t=5.
    steps = [StepRecord(4.0 + i, i, seconds=1.0) for i in range(1, 21)]
    return Timeline(steps=steps, start_time=0.0, checkpoint_blocking_seconds=0.0).report()


def test_each_mode_is_compared_with_its_own_run_without_faults() -> None:
    mode, result, report = _run()
    baseline = _fault_free_report()
    assert (baseline.goodput_from_first_step, baseline.goodput_from_submission) == (1.0, 20.0 / 24.0)
    row = bench.summary_row(mode, result, report, PLAN, baseline)
    assert row["fault_free_goodput_from_first_step"] == 1.0
    assert row["relative_goodput_from_first_step"] == pytest.approx((20.0 / 37.0) / 1.0)
    assert row["relative_goodput_from_submission"] == pytest.approx((20.0 / 41.0) / (20.0 / 24.0))
    header, _, line, _ = bench.goodput_table([row], PLAN).splitlines()
    assert header.endswith("vs fault-free from 1st step  vs fault-free from submission")
    assert line.split()[-2:] == ["54.1%", "58.5%"]
    json.dumps(row)


def test_lost_time_table_splits_each_modes_lost_seconds_by_cause() -> None:
    mode, result, report = _run()
    row = bench.summary_row(mode, result, report, PLAN)
    lost = row["lost_time"]
    # 41 s from submission, 20 useful: 4 of start-up; the SIGKILL: 0.5 in flight, 1.5 to the
    # in-job restart at 16.0, 3.0 more before step 6 began at 19.0, 5 steps redone (6-10); the
    # node: 0.5 in flight, 2.5 to the replacement at 37.0, 2.0 more before step 19 began at 39.0,
    # 2 steps redone (19-20).
    assert lost == {
        "start-up": pytest.approx(4.0),
        "detection": pytest.approx(1.5 + 2.5),
        "restart": pytest.approx(3.0 + 2.0),
        "lost work": pytest.approx(0.5 + 5 + 0.5 + 2),
        "checkpoint blocking": None,  # the timeline does not say
        "other": pytest.approx(0.0),
    }
    text = bench.lost_time_table([row]).splitlines()
    assert text[0].split()[:3] == ["mode", "start-up", "detection"] and text[0].split()[-1] == "total"
    assert text[2].startswith("ft-launcher (async)") and text[2].split()[-1] == "21.0"
    markdown = bench.lost_time_table([row], markdown=True).splitlines()
    causes = "start-up | detection | restart | lost work | checkpoint blocking | other"
    assert markdown[0] == f"| mode | {causes} | total |"
    assert markdown[2].startswith("| ft-launcher (async) | 4.0 |")
    # A mode whose run recorded no step has no line.
    failed = JobResult("b", "Failed", Timeline(), {}, [], False, "no")
    assert len(bench.lost_time_table([bench.summary_row(mode, failed, None, PLAN)]).splitlines()) == 3
