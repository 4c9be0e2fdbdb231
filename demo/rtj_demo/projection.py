"""A projection of what one fault costs a large job, and of its effective training time ratio (ETTR:
productive time / wall time), at 1,000 and 16,384 GPUs.

Pure arithmetic, no I/O. It combines three kinds of figures, kept apart so each can be replaced:

- fault rates and GPU-side costs (communicator initialization, checkpoint size, storage throughput)
  taken from publications, as module constants with their source beside each;
- the project's own measured figures (failure detection, pod replacement, process restart, steps
  lost, checkpoint blocking), passed in by name (`MEASURED_PLACEHOLDERS` lists them, with the values
  `docs/benchmarks.md` has today; detection and replacement at 1,000 nodes from `rtj bench scale`);
- the recovery mode: a cold restart of the whole job from the newest checkpoint, or a hot spare's
  in-process take-over with no step lost.

The model is first order, as in Young (1974); ETTR is the metric of Kokolis et al. (2025):
interruptions arrive at a constant rate per GPU-hour, so a job of N GPUs sees one every
1 / (rate * N) hours; each stops the whole job for the sum of its recovery phases (every GPU waits);
checkpoint saves block training for their blocking time once per interval. The `rtj_demo.report`
module measures the same quantities on a real run; this one extrapolates them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum

# --- Published figures (each with its source) ---------------------------------------------------

# "The Llama 3 Herd of Models" (Meta, 2024), section 3.3.4 Reliability and Operational Challenges:
# 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs.
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_GPUS = 16_384

# "Collective Communication for 100k+ GPUs" (Si et al., Meta, arXiv:2510.20171), section 1: stock
# NCCL's bootstrap and connection set-up take about 265 s at 96k GPUs. Used here as an upper bound of
# a communicator's initialization at 1,000 and 16,384 GPUs; no figure for those scales was found.
COMMUNICATOR_INIT_SECONDS_BOUND = 265.0

# "The Llama 3 Herd of Models", section 3.3.1 (Storage): checkpoints save each GPU's model state,
# "ranging from 1 MB to 4 GB per GPU". The upper end.
CHECKPOINT_BYTES_PER_GPU = 4e9

# Amazon FSx for Lustre, "Managing throughput capacity": PERSISTENT_2 SSD file systems offer 125,
# 250, 500 or 1,000 MB/s per TiB provisioned. The highest tier.
FSX_MB_PER_SECOND_PER_TIB = 1000.0
# A scenario assumption, not a published figure: the file system's provisioned size.
FSX_PROVISIONED_TIB = 100.0

# The two scales of the projection, on p5.48xlarge nodes of 8 H100.
GPUS_PER_NODE = 8
SCALES = (1_000, 16_384)

# --- The project's measured figures (docs/benchmarks.md; `rtj bench scale` for the control plane's) ---

MEASURED_PLACEHOLDERS: Mapping[str, float] = {
    # A lost node's detection at 1,000 nodes: Kubernetes' node-monitor grace period (50 s, its
    # default since 1.32), then the job's nodeLossGraceSeconds (10 s by default), then the operator's
    # own reaction, 2.0 s p50 at 1,000 nodes (rtj bench scale, scale-20261205T152847: 1.97 s).
    "cold_detection_seconds": 62.0,
    # The replacement pod created after the operator judged the node lost: 1.3 s p50 at 1,000 nodes
    # (rtj bench scale, 1% of the nodes lost: 1.27 s p50, 1.95 s max).
    "cold_replacement_seconds": 1.3,
    # A whole-job restart on the local cluster, the fault to the next step (plain-restart, node loss,
    # 28.0 s, goodput-20261201T022711), less the 3 s of detection: pods started, processes started,
    # rendezvous. CPU side only: no NCCL, EFA or GPU.
    "cold_restart_seconds": 25.0,
    # Supervisor with hot spares (full mode), node loss: the sibling monitors' heartbeat timeout...
    "hot_spare_detection_seconds": 3.0,
    # ...then the in-process restart onto a spare's reserve ranks (4.1 s in all, 2026-12-03).
    "hot_spare_restart_seconds": 1.1,
    # Steps lost by a hot spare's take-over: none (the state comes from the memory copy).
    "hot_spare_steps_lost_seconds": 0.0,
    # An async save point's blocking time: at most 3.9 ms (256 MiB per rank, rtj bench checkpoint).
    "checkpoint_blocking_seconds": 0.004,
}


class RecoveryMode(Enum):
    """How the job gets going again after an interruption."""

    # Every worker restarts from the newest durable checkpoint, on replacement pods for lost nodes.
    COLD_RESTART = "cold restart"
    # A hot spare's ranks take the lost ranks' places in-process from a memory copy of the state; the
    # replacement of the lost pod refills the spare beside training, off the critical path.
    HOT_SPARE = "hot spare"


@dataclass(frozen=True)
class Recovery:
    """The phases of one recovery, in seconds of wall time during which the whole job stands still."""

    mode: RecoveryMode
    # The fault to the first layer acting on it.
    detection_seconds: float
    # Detection to every replacement pod created and bound (a cold restart's; a hot spare's replacement
    # is off the critical path and not counted).
    replacement_seconds: float
    # Pod (or in-process) restart to the processes ready to train: process start, rendezvous.
    restart_seconds: float
    # Communicator (NCCL over EFA) initialization.
    communicator_init_seconds: float
    # Reading the newest checkpoint (a cold restart's; a hot spare resumes from memory).
    checkpoint_load_seconds: float
    # Work computed again beyond what the checkpoint interval implies (the step in flight).
    steps_lost_seconds: float


@dataclass(frozen=True)
class Checkpointing:
    """Durable checkpoints: what a save point blocks, how long the write takes, how often."""

    # Training time one save point blocks (an async save: the hand-off; a sync save: the whole write).
    blocking_seconds: float
    # The save point to the checkpoint being durable; an async writer takes no new save meanwhile, so
    # this also bounds the interval from below.
    write_seconds: float
    # Productive seconds between save points; None: Young/Daly's optimum, at least `write_seconds`.
    interval_seconds: float | None = None


@dataclass(frozen=True)
class Scenario:
    """One job: its size, its fault rate, how it recovers and how it checkpoints."""

    name: str
    gpus: int
    recovery: Recovery
    checkpointing: Checkpointing
    interruptions_per_gpu_hour: float
    gpus_per_node: int = GPUS_PER_NODE


@dataclass(frozen=True)
class FaultCost:
    """What one interruption costs: the job's wall seconds per phase, and GPU-hours for the job."""

    phases: Mapping[str, float]
    gpus: int

    @property
    def wall_seconds(self) -> float:
        return sum(self.phases.values())

    @property
    def gpu_hours(self) -> float:
        return self.wall_seconds * self.gpus / 3600.0


@dataclass(frozen=True)
class Projection:
    """A scenario's figures: interruptions, one fault's cost, the checkpoint interval and ETTR."""

    scenario: Scenario
    nodes: int
    mtbf_hours: float
    checkpoint_interval_seconds: float
    fault: FaultCost
    ettr: float


def _require(name: str, value: float, *, positive: bool = False) -> None:
    """Raise ValueError naming `name` if `value` is negative (or not positive), or not finite."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        rule = "positive" if positive else "non-negative"
        raise ValueError(f"{name} must be a finite, {rule} number, not {value!r}")


def interruptions_per_gpu_hour(interruptions: float, days: float, gpus: int) -> float:
    """A fault rate per GPU-hour from a count of interruptions over `days` on `gpus` GPUs."""
    _require("interruptions", interruptions)
    _require("days", days, positive=True)
    _require("gpus", gpus, positive=True)
    return interruptions / (days * 24.0 * gpus)


# 419 / (54 days * 24 h * 16,384 GPUs): about 1.97e-5 interruptions per GPU-hour.
LLAMA3_RATE_PER_GPU_HOUR = interruptions_per_gpu_hour(
    LLAMA3_UNEXPECTED_INTERRUPTIONS, LLAMA3_SNAPSHOT_DAYS, LLAMA3_GPUS
)


def job_mtbf_hours(rate_per_gpu_hour: float, gpus: int) -> float:
    """Mean time between interruptions of a job of `gpus` GPUs: 1 / (rate * gpus)."""
    _require("rate_per_gpu_hour", rate_per_gpu_hour, positive=True)
    _require("gpus", gpus, positive=True)
    return 1.0 / (rate_per_gpu_hour * gpus)


def young_daly_interval_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's (1974) optimum checkpoint interval, also Daly's (2006) first order: sqrt(2 C M)."""
    _require("save_seconds", save_seconds)
    _require("mtbf_seconds", mtbf_seconds, positive=True)
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


def checkpoint_load_seconds(bytes_per_gpu: float, gpus: int, storage_bytes_per_second: float) -> float:
    """Seconds to read every GPU's share of a checkpoint at the storage's aggregate throughput."""
    _require("bytes_per_gpu", bytes_per_gpu)
    _require("gpus", gpus, positive=True)
    _require("storage_bytes_per_second", storage_bytes_per_second, positive=True)
    return bytes_per_gpu * gpus / storage_bytes_per_second


def checkpoint_interval_seconds(checkpointing: Checkpointing, mtbf_seconds: float) -> float:
    """The interval given, or Young/Daly's from the blocking time, no shorter than one write."""
    _require("checkpointing.blocking_seconds", checkpointing.blocking_seconds)
    _require("checkpointing.write_seconds", checkpointing.write_seconds)
    if checkpointing.interval_seconds is not None:
        _require("checkpointing.interval_seconds", checkpointing.interval_seconds, positive=True)
        return checkpointing.interval_seconds
    interval = max(
        young_daly_interval_seconds(checkpointing.blocking_seconds, mtbf_seconds), checkpointing.write_seconds
    )
    if interval == 0:
        raise ValueError("checkpointing.interval_seconds is needed when saves cost nothing and take no time")
    return interval


def _validate_recovery(recovery: Recovery) -> None:
    for field in (
        "detection_seconds",
        "replacement_seconds",
        "restart_seconds",
        "communicator_init_seconds",
        "checkpoint_load_seconds",
        "steps_lost_seconds",
    ):
        _require(f"recovery.{field}", getattr(recovery, field))


def fault_cost(
    recovery: Recovery, checkpointing: Checkpointing, interval_seconds: float, gpus: int
) -> FaultCost:
    """One interruption's cost, by phase. A cold restart also redoes, on average, half an interval
    and whatever the newest durable checkpoint trailed the newest save point by (an async write's
    time beyond its blocking); a hot spare redoes only the steps it lost."""
    _validate_recovery(recovery)
    _require("gpus", gpus, positive=True)
    if recovery.mode is RecoveryMode.HOT_SPARE:
        return FaultCost(
            phases={
                "detection": recovery.detection_seconds,
                "replacement": 0.0,
                "restart": recovery.restart_seconds,
                "communicator init": recovery.communicator_init_seconds,
                "checkpoint load": 0.0,
                "lost work": recovery.steps_lost_seconds,
            },
            gpus=gpus,
        )
    commit_lag = max(0.0, checkpointing.write_seconds - checkpointing.blocking_seconds)
    return FaultCost(
        phases={
            "detection": recovery.detection_seconds,
            "replacement": recovery.replacement_seconds,
            "restart": recovery.restart_seconds,
            "communicator init": recovery.communicator_init_seconds,
            "checkpoint load": recovery.checkpoint_load_seconds,
            "lost work": interval_seconds / 2.0 + commit_lag + recovery.steps_lost_seconds,
        },
        gpus=gpus,
    )


def ettr(
    fault_seconds: float, mtbf_seconds: float, interval_seconds: float, blocking_seconds: float
) -> float:
    """Productive time / wall time: the share of wall time not lost to interruptions, of which a
    share interval / (interval + blocking) trains. Zero when faults cost more than the time between."""
    _require("fault_seconds", fault_seconds)
    _require("mtbf_seconds", mtbf_seconds, positive=True)
    _require("interval_seconds", interval_seconds, positive=True)
    _require("blocking_seconds", blocking_seconds)
    available = max(0.0, 1.0 - fault_seconds / mtbf_seconds)
    return available * interval_seconds / (interval_seconds + blocking_seconds)


def project(scenario: Scenario) -> Projection:
    """A scenario's interruption interval, checkpoint interval, fault cost and ETTR."""
    _require("gpus_per_node", scenario.gpus_per_node, positive=True)
    mtbf_hours = job_mtbf_hours(scenario.interruptions_per_gpu_hour, scenario.gpus)
    mtbf_seconds = mtbf_hours * 3600.0
    interval = checkpoint_interval_seconds(scenario.checkpointing, mtbf_seconds)
    cost = fault_cost(scenario.recovery, scenario.checkpointing, interval, scenario.gpus)
    return Projection(
        scenario=scenario,
        nodes=math.ceil(scenario.gpus / scenario.gpus_per_node),
        mtbf_hours=mtbf_hours,
        checkpoint_interval_seconds=interval,
        fault=cost,
        ettr=ettr(cost.wall_seconds, mtbf_seconds, interval, scenario.checkpointing.blocking_seconds),
    )


PHASES = ("detection", "replacement", "restart", "communicator init", "checkpoint load", "lost work")


def render_table(projections: Iterable[Projection]) -> str:
    """A markdown table: one row per scenario, one fault's cost by phase (seconds the job stands
    still), in GPU-hours for the job, the mean time between interruptions and ETTR."""
    header = (
        "| GPUs (nodes) | recovery | MTBF h | checkpoint every s | "
        + " | ".join(f"{phase} s" for phase in PHASES)
        + " | per fault s | per fault GPU-h | ETTR |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for p in projections:
        phases = " | ".join(f"{p.fault.phases[phase]:,.1f}" for phase in PHASES)
        lines.append(
            f"| {p.scenario.gpus:,} ({p.nodes:,}) | {p.scenario.name} | {p.mtbf_hours:.2f} | "
            f"{p.checkpoint_interval_seconds:,.0f} | {phases} | {p.fault.wall_seconds:,.1f} | "
            f"{p.fault.gpu_hours:,.1f} | {p.ettr:.2%} |"
        )
    return "\n".join(lines)


def _measured_value(measured: Mapping[str, float], key: str, gpus: int) -> float:
    """`key@<gpus>` if given (a figure measured at that scale), else `key`, else the placeholder."""
    return measured.get(f"{key}@{gpus}", measured.get(key, MEASURED_PLACEHOLDERS[key]))


def _check_measured(measured: Mapping[str, float]) -> None:
    for name, value in measured.items():
        key, _, scale = name.partition("@")
        if key not in MEASURED_PLACEHOLDERS or (scale and scale not in {str(s) for s in SCALES}):
            raise ValueError(f"measured: unknown figure {name!r}; known: {sorted(MEASURED_PLACEHOLDERS)}")
        _require(f"measured[{name!r}]", value)


def default_scenarios(measured: Mapping[str, float]) -> list[Scenario]:
    """The documented scenarios at 1,000 and 16,384 GPUs: a cold restart, a hot spare with the
    GPU-side communicator bound, and a hot spare as measured here (control plane and trainer only)."""
    _check_measured(measured)
    scenarios = []
    for gpus in SCALES:
        figure = {key: _measured_value(measured, key, gpus) for key in MEASURED_PLACEHOLDERS}
        load = checkpoint_load_seconds(
            CHECKPOINT_BYTES_PER_GPU, gpus, FSX_MB_PER_SECOND_PER_TIB * 1e6 * FSX_PROVISIONED_TIB
        )
        # The write of a checkpoint moves the same bytes through the same file system as its read.
        checkpointing = Checkpointing(
            blocking_seconds=figure["checkpoint_blocking_seconds"], write_seconds=load
        )
        cold = Recovery(
            mode=RecoveryMode.COLD_RESTART,
            detection_seconds=figure["cold_detection_seconds"],
            replacement_seconds=figure["cold_replacement_seconds"],
            restart_seconds=figure["cold_restart_seconds"],
            communicator_init_seconds=COMMUNICATOR_INIT_SECONDS_BOUND,
            checkpoint_load_seconds=load,
            steps_lost_seconds=0.0,
        )
        hot = Recovery(
            mode=RecoveryMode.HOT_SPARE,
            detection_seconds=figure["hot_spare_detection_seconds"],
            replacement_seconds=0.0,
            restart_seconds=figure["hot_spare_restart_seconds"],
            communicator_init_seconds=COMMUNICATOR_INIT_SECONDS_BOUND,
            checkpoint_load_seconds=0.0,
            steps_lost_seconds=figure["hot_spare_steps_lost_seconds"],
        )
        hot_measured_only = replace(hot, communicator_init_seconds=0.0)
        for name, recovery in (
            ("cold restart", cold),
            ("hot spare", hot),
            ("hot spare, no GPU-side cost", hot_measured_only),
        ):
            scenarios.append(Scenario(name, gpus, recovery, checkpointing, LLAMA3_RATE_PER_GPU_HOUR))
    return scenarios


def projection_table(measured: Mapping[str, float]) -> str:
    """The markdown table of `default_scenarios`, with the measured figures given (by the names of
    `MEASURED_PLACEHOLDERS`, optionally `name@1000` or `name@16384` for one scale) in place of the
    placeholders. An unknown name or a negative figure raises ValueError."""
    return render_table(project(scenario) for scenario in default_scenarios(measured))
