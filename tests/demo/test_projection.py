"""The projection's arithmetic on cases computed by hand, its monotonicity, and its refusals."""

import math
from pathlib import Path

import pytest
from rtj_demo.projection import (
    LLAMA3_RATE_PER_GPU_HOUR,
    MEASURED_PLACEHOLDERS,
    Checkpointing,
    Recovery,
    RecoveryMode,
    Scenario,
    checkpoint_interval_seconds,
    checkpoint_load_seconds,
    default_scenarios,
    ettr,
    fault_cost,
    interruptions_per_gpu_hour,
    job_mtbf_hours,
    project,
    projection_table,
    render_table,
    young_daly_interval_seconds,
)


def _recovery(mode: RecoveryMode = RecoveryMode.COLD_RESTART, **seconds: float) -> Recovery:
    phases = {
        "detection_seconds": 10.0,
        "replacement_seconds": 20.0,
        "restart_seconds": 30.0,
        "communicator_init_seconds": 40.0,
        "checkpoint_load_seconds": 50.0,
        "steps_lost_seconds": 6.0,
    }
    return Recovery(mode=mode, **{**phases, **seconds})


def _scenario(
    rate: float = 1e-5, gpus: int = 1000, mode: RecoveryMode = RecoveryMode.COLD_RESTART, **seconds: float
) -> Scenario:
    return Scenario(
        name="case",
        gpus=gpus,
        recovery=_recovery(mode, **seconds),
        checkpointing=Checkpointing(blocking_seconds=2.0, write_seconds=8.0, interval_seconds=600.0),
        interruptions_per_gpu_hour=rate,
    )


def test_the_llama3_rate_gives_one_interruption_every_3_09_hours_at_16384_gpus() -> None:
    rate = LLAMA3_RATE_PER_GPU_HOUR
    assert rate == pytest.approx(419 / (54 * 24 * 16_384))
    assert job_mtbf_hours(rate, 16_384) == pytest.approx(54 * 24 / 419)
    assert job_mtbf_hours(rate, 16_384) == pytest.approx(3.093, abs=1e-3)
    # 16.384 times as long at 1,000 GPUs.
    assert job_mtbf_hours(rate, 1000) == pytest.approx(54 * 24 / 419 * 16.384)


def test_interruptions_per_gpu_hour() -> None:
    assert interruptions_per_gpu_hour(48, days=2, gpus=10) == pytest.approx(0.1)


def test_young_daly_interval_is_the_root_of_twice_the_save_cost_times_the_mtbf() -> None:
    assert young_daly_interval_seconds(save_seconds=50.0, mtbf_seconds=3600.0) == pytest.approx(600.0)
    assert young_daly_interval_seconds(save_seconds=0.0, mtbf_seconds=3600.0) == 0.0


def test_interval_is_young_daly_unless_given_and_never_shorter_than_a_write() -> None:
    assert checkpoint_interval_seconds(Checkpointing(50.0, 8.0), mtbf_seconds=3600.0) == pytest.approx(600.0)
    # An async save blocking 2 ms: Young/Daly says 3.8 s, but the writer needs 100 s per checkpoint.
    assert checkpoint_interval_seconds(Checkpointing(0.002, 100.0), mtbf_seconds=3600.0) == 100.0
    assert checkpoint_interval_seconds(Checkpointing(50.0, 8.0, 900.0), mtbf_seconds=3600.0) == 900.0
    with pytest.raises(ValueError, match="interval_seconds"):
        checkpoint_interval_seconds(Checkpointing(0.0, 0.0), mtbf_seconds=3600.0)


def test_checkpoint_load_is_the_bytes_of_every_gpu_over_the_throughput() -> None:
    # 4 GB per GPU, 1,000 GPUs, 100 GB/s: 40 s.
    assert checkpoint_load_seconds(4e9, 1000, 100e9) == pytest.approx(40.0)


def test_a_cold_restart_costs_every_phase_half_an_interval_and_the_commit_lag() -> None:
    cost = fault_cost(_recovery(), Checkpointing(2.0, 8.0), interval_seconds=600.0, gpus=1000)
    assert cost.phases == {
        "detection": 10.0,
        "replacement": 20.0,
        "restart": 30.0,
        "communicator init": 40.0,
        "checkpoint load": 50.0,
        # 600 / 2 + (8 - 2) + 6
        "lost work": 312.0,
    }
    assert cost.wall_seconds == pytest.approx(462.0)
    assert cost.gpu_hours == pytest.approx(462.0 * 1000 / 3600)


def test_a_hot_spare_skips_the_replacement_and_the_checkpoint_and_loses_only_its_steps() -> None:
    cost = fault_cost(_recovery(RecoveryMode.HOT_SPARE), Checkpointing(2.0, 8.0), 600.0, gpus=16)
    assert cost.phases == {
        "detection": 10.0,
        "replacement": 0.0,
        "restart": 30.0,
        "communicator init": 40.0,
        "checkpoint load": 0.0,
        "lost work": 6.0,
    }


def test_ettr_by_hand() -> None:
    # One hour between faults, 360 s lost to each: 90% available; a save blocking 6 s every 594 s: 99%.
    assert ettr(fault_seconds=360.0, mtbf_seconds=3600.0, interval_seconds=594.0, blocking_seconds=6.0) == (
        pytest.approx(0.9 * 0.99)
    )
    # Faults that cost more than the time between them leave nothing.
    assert ettr(7200.0, 3600.0, 600.0, 0.0) == 0.0


def test_project_puts_the_pieces_together() -> None:
    p = project(_scenario(rate=1e-5, gpus=1000))
    assert p.nodes == 125
    assert p.mtbf_hours == pytest.approx(100.0)
    assert p.checkpoint_interval_seconds == 600.0
    assert p.fault.wall_seconds == pytest.approx(462.0)
    assert p.ettr == pytest.approx((1 - 462.0 / 360_000.0) * 600.0 / 602.0)


def test_ettr_falls_as_the_fault_rate_rises() -> None:
    rates = [1e-7, 1e-6, 1e-5, 1e-4, 1e-3]
    ettrs = [project(_scenario(rate=rate)).ettr for rate in rates]
    assert ettrs == sorted(ettrs, reverse=True)
    assert len(set(ettrs)) == len(ettrs)


@pytest.mark.parametrize(
    "phase", ["detection_seconds", "replacement_seconds", "restart_seconds", "checkpoint_load_seconds"]
)
def test_ettr_falls_as_a_recovery_phase_grows(phase: str) -> None:
    ettrs = [project(_scenario(**{phase: seconds})).ettr for seconds in (0.0, 60.0, 600.0, 6000.0)]
    assert ettrs == sorted(ettrs, reverse=True)
    assert len(set(ettrs)) == len(ettrs)


def test_ettr_falls_with_the_job_size() -> None:
    ettrs = [project(_scenario(gpus=gpus)).ettr for gpus in (8, 1000, 16_384, 100_000)]
    assert ettrs == sorted(ettrs, reverse=True)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: job_mtbf_hours(-1e-5, 1000), "rate_per_gpu_hour"),
        (lambda: job_mtbf_hours(1e-5, 0), "gpus"),
        (lambda: interruptions_per_gpu_hour(-1, 54, 16_384), "interruptions"),
        (lambda: interruptions_per_gpu_hour(419, 0, 16_384), "days"),
        (lambda: young_daly_interval_seconds(-1.0, 3600.0), "save_seconds"),
        (lambda: young_daly_interval_seconds(1.0, 0.0), "mtbf_seconds"),
        (lambda: checkpoint_load_seconds(4e9, 1000, 0.0), "storage_bytes_per_second"),
        (lambda: project(_scenario(rate=-1e-5)), "rate_per_gpu_hour"),
        (lambda: project(_scenario(gpus=0)), "gpus"),
        (lambda: project(_scenario(detection_seconds=-1.0)), "recovery.detection_seconds"),
        (lambda: project(_scenario(restart_seconds=math.nan)), "recovery.restart_seconds"),
        (lambda: ettr(1.0, 3600.0, 0.0, 0.0), "interval_seconds"),
    ],
)
def test_bad_input_raises_naming_the_argument(call: object, argument: str) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match=argument.replace(".", r"\.")):
        call()


def test_the_default_scenarios_are_three_recoveries_at_each_scale() -> None:
    scenarios = default_scenarios({})
    assert [(s.gpus, s.name) for s in scenarios] == [
        (gpus, name)
        for gpus in (1000, 16_384)
        for name in ("cold restart", "hot spare", "hot spare, no GPU-side cost")
    ]
    projections = [project(s) for s in scenarios]
    assert [p.nodes for p in projections] == [125] * 3 + [2048] * 3
    # At each scale a hot spare beats a cold restart, and without the GPU side it costs the least.
    for cold, hot, bare in (projections[:3], projections[3:]):
        assert cold.ettr < hot.ettr < bare.ettr


def test_measured_figures_replace_the_placeholders_for_both_scales_or_one() -> None:
    base = {(s.gpus, s.name): s for s in default_scenarios({})}
    given = {(s.gpus, s.name): s for s in default_scenarios({"cold_replacement_seconds": 30.0})}
    for gpus in (1000, 16_384):
        assert given[gpus, "cold restart"].recovery.replacement_seconds == 30.0
        assert (
            base[gpus, "cold restart"].recovery.replacement_seconds
            == MEASURED_PLACEHOLDERS["cold_replacement_seconds"]
        )
    one = {(s.gpus, s.name): s for s in default_scenarios({"cold_detection_seconds@16384": 50.0})}
    assert one[16_384, "cold restart"].recovery.detection_seconds == 50.0
    assert (
        one[1000, "cold restart"].recovery.detection_seconds
        == MEASURED_PLACEHOLDERS["cold_detection_seconds"]
    )


@pytest.mark.parametrize("measured", [{"detection": 1.0}, {"cold_detection_seconds@512": 1.0}])
def test_an_unknown_measured_figure_is_refused(measured: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="measured"):
        projection_table(measured)


def test_a_negative_measured_figure_is_refused() -> None:
    with pytest.raises(ValueError, match="cold_restart_seconds"):
        projection_table({"cold_restart_seconds": -1.0})


def test_the_table_has_a_row_per_scenario_and_the_figures() -> None:
    table = projection_table({})
    lines = table.splitlines()
    assert len(lines) == 2 + 6
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    assert {line.count("|") for line in lines} == {lines[0].count("|")}
    assert "| 16,384 (2,048) | cold restart | 3.09 |" in table
    assert "| 1,000 (125) | hot spare | 50.68 |" in table


def test_render_table_of_nothing_is_the_header() -> None:
    assert len(render_table([]).splitlines()) == 2


def test_the_documented_table_is_the_one_the_placeholders_give() -> None:
    # docs/benchmarks.md shows projection_table({}); a change to the inputs or the method changes both.
    docs = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
    assert projection_table({}) in docs.read_text()
