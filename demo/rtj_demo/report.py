"""The fault-rehearsal report: recovery time, lost steps and goodput, computed from a run's timeline.

Pure functions over plain records, shared by `rtj demo` and `rtj bench goodput`: the runners collect a
timeline (step completions, checkpoint commits, injected faults, recoveries seen by each layer) and
this module turns it into figures. Definitions follow the AWS NVRx-on-EKS sample:

- training goodput = useful step time / wall time, where a step's time is useful only if its result
  survived (steps recomputed after resuming from an older checkpoint count once, the lost run not at all).
  Reported two ways: from the first training step (wall time from the start of the first step to the
  last step: what the recovery layers cost) and from submission (the job's start-up included: what the
  user waits for); start-up = submission to the start of the first step, reported apart;
- steps lost for a fault = the last step completed before the fault - the step training resumed from;
- recovery seconds for a fault = time of the first step completed after the fault - time of the fault.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Recovery layers, cheapest first. A fault is attributed to the most expensive layer that acted on it.
LAYER_IN_PROCESS = "in-process"
LAYER_IN_JOB = "in-job"
LAYER_POD_REPLACEMENT = "pod-replacement"
LAYER_JOB_RESTART = "job-restart"
# Kubernetes alone (no operator): the Job controller recreated failed pods (`rtj_demo.indexedjob`).
LAYER_JOB_CONTROLLER = "job-controller"
LAYER_ORDER = (LAYER_IN_PROCESS, LAYER_IN_JOB, LAYER_POD_REPLACEMENT, LAYER_JOB_RESTART, LAYER_JOB_CONTROLLER)

# Which layer each fault class should be recovered by under the default launcher (FtLauncher) with
# every layer enabled (the Supervisor launcher's are in `configurations`).
INTENDED_LAYER = {
    "exception": LAYER_IN_PROCESS,
    "sigkill": LAYER_IN_JOB,
    "hang": LAYER_IN_PROCESS,
    "node-loss": LAYER_POD_REPLACEMENT,
}


@dataclass(frozen=True)
class StepRecord:
    """A training step completed (as seen by global rank 0) at wall-clock `time` (seconds).

    `seconds` is the step's own compute time when the trainer measured it (its `stepTimeSeconds`):
    then a checkpoint save or a report between two steps is not counted as useful time.
    """

    time: float
    step: int
    seconds: float | None = None


@dataclass(frozen=True)
class FaultRecord:
    """A fault injected at `time`; `kind` is one of INTENDED_LAYER's keys. `step`, when known, is the
    number of steps completed when it fired (a trainer fault fires at the start of the next step)."""

    time: float
    kind: str
    step: int | None = None
    # A node loss: when killing the node's processes was over (the kill begins at `time`).
    killed_by: float | None = None


# The most seconds from a node's loss to the next step for the loss to have interrupted nothing.
NOTHING_INTERRUPTED_SECONDS = 1.0


@dataclass(frozen=True)
class RecoveryRecord:
    """A layer acted (restarted something) at `time`."""

    time: float
    layer: str


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint of `step` was committed (complete on storage) at `time`."""

    time: float
    step: int


@dataclass
class FaultReport:
    kind: str
    time: float
    intended_layer: str
    recovered_by: str | None
    recovery_seconds: float | None
    steps_lost: int | None
    step_at_fault: int | None
    resumed_from_step: int | None
    # The time training stood still for the fault, from the last step before it to the start of the
    # first step after it, in three parts (None where either step is unknown): the step in flight
    # when the fault came (lost work), the fault to the first layer acting on it (detection; 0 when
    # no action was seen), and the rest (restart).
    in_flight_seconds: float | None = None
    detection_seconds: float | None = None
    restart_seconds: float | None = None

    @property
    def as_intended(self) -> bool:
        return self.recovered_by == self.intended_layer or self.interrupted_nothing

    @property
    def interrupted_nothing(self) -> bool:
        """A node lost while its pod trained nothing: no layer acted, no step was lost and the next
        step came within a step's time or two. Under the Supervisor launcher a pod's ranks can all
        have moved to the spares' reserve ranks by then (a SIGKILLed rank's index always moves, a
        rank hung past the hard timeout's too), so there was nothing to recover."""
        return (
            self.kind == "node-loss"
            and self.recovered_by is None
            and self.steps_lost == 0
            and self.recovery_seconds is not None
            and self.recovery_seconds <= NOTHING_INTERRUPTED_SECONDS
        )


@dataclass
class RunReport:
    """A run's figures. `wall_seconds` and `training_goodput` use the report's window (from submission
    when the runner gave its time, else from the first step); the `*_from_first_step` and
    `*_from_submission` figures name their window."""

    wall_seconds: float
    useful_seconds: float
    training_goodput: float
    final_step: int
    steps_computed: int
    median_step_seconds: float
    checkpoints: int
    first_step_start: float  # when the first step began (its completion minus its duration)
    wall_from_first_step_seconds: float
    goodput_from_first_step: float
    startup_seconds: float | None = None  # submission -> first step start; None without a submission time
    goodput_from_submission: float | None = None
    faults: list[FaultReport] = field(default_factory=list)
    checkpoint_blocking_seconds: float | None = None  # as the trainer counted it

    @property
    def all_recovered_as_intended(self) -> bool:
        return all(f.as_intended for f in self.faults)

    @property
    def seconds_per_fault(self) -> float | None:
        """Mean recovery seconds over the faults that were recovered (None when none was)."""
        recovered = [f.recovery_seconds for f in self.faults if f.recovery_seconds is not None]
        return sum(recovered) / len(recovered) if recovered else None

    @property
    def steps_lost(self) -> int:
        """Steps lost over every fault whose loss is known."""
        return sum(f.steps_lost for f in self.faults if f.steps_lost is not None)

    def lost_time(self) -> dict[str, float | None]:
        """The wall time that was not useful training, by cause, in seconds (see `lost_time`)."""
        return lost_time(self)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for fault, entry in zip(self.faults, data["faults"], strict=True):
            entry["as_intended"] = fault.as_intended
        data["all_recovered_as_intended"] = self.all_recovered_as_intended
        data["seconds_per_fault"] = self.seconds_per_fault
        data["steps_lost"] = self.steps_lost
        data["lost_time"] = self.lost_time()
        return data


def _sorted_steps(steps: Iterable[StepRecord]) -> list[StepRecord]:
    return sorted(steps, key=lambda s: (s.time, s.step))


def step_durations(steps: Sequence[StepRecord], faults: Sequence[FaultRecord]) -> list[float | None]:
    """Duration of each step: its measured compute time when recorded, else the gap to the previous
    record when it is the previous step of the same uninterrupted run, else None (the first step of a
    run also carries start-up or recovery time)."""
    fault_times = sorted(f.time for f in faults)
    durations: list[float | None] = []
    for i, record in enumerate(steps):
        if record.seconds is not None:
            durations.append(record.seconds)
            continue
        if i == 0:
            durations.append(None)
            continue
        prev = steps[i - 1]
        interrupted = any(prev.time < t <= record.time for t in fault_times)
        if record.step == prev.step + 1 and not interrupted:
            durations.append(record.time - prev.time)
        else:
            durations.append(None)
    return durations


def useful_step_seconds(steps: Sequence[StepRecord], faults: Sequence[FaultRecord]) -> tuple[float, float]:
    """(useful seconds, median step seconds). A step number that was computed more than once (redone
    after a resume from an older checkpoint) counts only for its last computation; steps whose own
    duration is unknown (first of a run) count at the median step time."""
    ordered = _sorted_steps(steps)
    durations = step_durations(ordered, faults)
    known = [d for d in durations if d is not None]
    median = statistics.median(known) if known else 0.0
    last_duration: dict[int, float] = {}
    for record, duration in zip(ordered, durations, strict=True):
        last_duration[record.step] = median if duration is None else duration
    return sum(last_duration.values()), median


def attribute_fault(
    fault: FaultRecord,
    steps: Sequence[StepRecord],
    recoveries: Sequence[RecoveryRecord],
    next_fault_time: float | None,
    intended: Mapping[str, str] = INTENDED_LAYER,
    *,
    median_step_seconds: float = 0.0,
) -> FaultReport:
    """Recovery time, lost steps and the recovering layer of one fault, judged against the layer
    `intended` names for its class; the stall split as `FaultReport` says (the first step after the
    fault began its own duration, or `median_step_seconds`, before it completed)."""
    ordered = _sorted_steps(steps)
    before = [s for s in ordered if s.time <= fault.time]
    after = [
        s for s in ordered if s.time > fault.time and (next_fault_time is None or s.time <= next_fault_time)
    ]
    step_at_fault = before[-1].step if before else None
    first_after = after[0] if after else None
    window_end = first_after.time if first_after else next_fault_time
    end = window_end if window_end is not None else float("inf")
    in_window = [r for r in recoveries if fault.time <= r.time <= end]
    acting = [r.layer for r in in_window if r.layer in LAYER_ORDER]
    recovered_by = max(acting, key=LAYER_ORDER.index) if acting else None
    first_acting = min((r.time for r in in_window), default=None)
    stall = _stall(fault.time, before[-1] if before else None, first_after, first_acting, median_step_seconds)
    resumed_from = first_after.step - 1 if first_after else None
    steps_lost = None
    if step_at_fault is not None and resumed_from is not None:
        steps_lost = max(0, step_at_fault - resumed_from)
    return FaultReport(
        kind=fault.kind,
        time=fault.time,
        intended_layer=intended.get(fault.kind, "unknown"),
        recovered_by=recovered_by,
        recovery_seconds=(first_after.time - fault.time) if first_after else None,
        steps_lost=steps_lost,
        step_at_fault=step_at_fault,
        resumed_from_step=resumed_from,
        in_flight_seconds=stall[0],
        detection_seconds=stall[1],
        restart_seconds=stall[2],
    )


def _stall(
    fault_time: float,
    last_before: StepRecord | None,
    first_after: StepRecord | None,
    first_acting: float | None,
    median_step_seconds: float,
) -> tuple[float | None, float | None, float | None]:
    """(in flight, detection, restart) seconds of one fault's stall (see `FaultReport`)."""
    if last_before is None or first_after is None:
        return None, None, None
    own = first_after.seconds
    resumed = first_after.time - (own if own is not None else median_step_seconds)
    stopped = max(0.0, resumed - last_before.time)
    in_flight = min(max(0.0, fault_time - last_before.time), stopped)
    waiting = stopped - in_flight
    detection = 0.0 if first_acting is None else min(max(0.0, first_acting - fault_time), waiting)
    return in_flight, detection, waiting - detection


def build_report(
    steps: Sequence[StepRecord],
    faults: Sequence[FaultRecord],
    recoveries: Sequence[RecoveryRecord],
    checkpoints: Sequence[CheckpointRecord],
    *,
    start_time: float | None = None,
    end_time: float | None = None,
    intended: Mapping[str, str] = INTENDED_LAYER,
    checkpoint_blocking_seconds: float | None = None,
) -> RunReport:
    """The whole run's report. Wall time runs from `start_time`, the job's submission (default: the
    start of the first step), to `end_time` (default: the last step completion); the figures from the
    first step use the start of the first step whatever `start_time` is."""
    ordered = _sorted_steps(steps)
    if not ordered:
        raise ValueError("no training step was recorded")
    useful, median = useful_step_seconds(ordered, faults)
    first = ordered[0]
    first_start = first.time - (first.seconds if first.seconds is not None else median)
    if start_time is not None:
        # A submission time after the first step's start (clock skew) means no start-up to count.
        first_start = max(first_start, start_time)
    begin = start_time if start_time is not None else first_start
    end = end_time if end_time is not None else ordered[-1].time
    wall = max(end - begin, 1e-9)
    wall_from_first = max(end - first_start, 1e-9)
    fault_list = sorted(faults, key=lambda f: f.time)
    reports = []
    for i, fault in enumerate(fault_list):
        next_time = fault_list[i + 1].time if i + 1 < len(fault_list) else None
        found = attribute_fault(fault, ordered, recoveries, next_time, intended, median_step_seconds=median)
        reports.append(found)
    return RunReport(
        wall_seconds=wall,
        useful_seconds=useful,
        training_goodput=min(1.0, useful / wall),
        final_step=max(s.step for s in ordered),
        steps_computed=len(ordered),
        median_step_seconds=median,
        checkpoints=len(checkpoints),
        first_step_start=first_start,
        wall_from_first_step_seconds=wall_from_first,
        goodput_from_first_step=min(1.0, useful / wall_from_first),
        startup_seconds=None if start_time is None else first_start - start_time,
        goodput_from_submission=None if start_time is None else min(1.0, useful / wall),
        faults=reports,
        checkpoint_blocking_seconds=checkpoint_blocking_seconds,
    )


LOST_TIME_CAUSES = ("start-up", "detection", "restart", "lost work", "checkpoint blocking", "other")


def lost_time(report: RunReport) -> dict[str, float | None]:
    """The run's wall time (from submission when known) that was not useful training, split by
    cause, in seconds:

    - start-up: submission to the start of the first step (None without a submission time);
    - detection: each fault to the first layer acting on it;
    - restart: from there to the start of the first step after the fault;
    - lost work: the step in flight at each fault, and the steps computed again after resuming from
      behind it (at the median step);
    - checkpoint blocking: what the trainer counted (None when it did not say);
    - other: the rest (what passes between steps: reports, data, the end of a run).

    The causes add up to the wall time minus the useful time."""
    faults = report.faults
    detection = sum(f.detection_seconds or 0.0 for f in faults)
    restart = sum(f.restart_seconds or 0.0 for f in faults)
    in_flight = sum(f.in_flight_seconds or 0.0 for f in faults)
    lost_work = in_flight + report.steps_lost * report.median_step_seconds
    blocking = report.checkpoint_blocking_seconds
    startup = report.startup_seconds
    known = (startup or 0.0) + detection + restart + lost_work + (blocking or 0.0)
    return {
        "start-up": startup,
        "detection": detection,
        "restart": restart,
        "lost work": lost_work,
        "checkpoint blocking": blocking,
        "other": report.wall_seconds - report.useful_seconds - known,
    }


def format_table(report: RunReport) -> str:
    """A plain-text table of the faults and the run's goodput, for the terminal."""
    header = f"{'fault':<10} {'recovered by':<16} {'intended':<16} {'seconds':>8} {'steps lost':>10}"
    lines = [header, "-" * len(header)]
    for f in report.faults:
        seconds = "-" if f.recovery_seconds is None else f"{f.recovery_seconds:.1f}"
        lost = "-" if f.steps_lost is None else str(f.steps_lost)
        mark = "" if f.as_intended else "  (!)"
        layer = f.recovered_by or ("nothing to do" if f.interrupted_nothing else "none")
        lines.append(f"{f.kind:<10} {layer:<16} {f.intended_layer:<16} {seconds:>8} {lost:>10}{mark}")
    lines.append("")
    lines.append(
        f"steps: {report.final_step} final, {report.steps_computed} computed; "
        f"median step {report.median_step_seconds:.3f} s; checkpoints: {report.checkpoints}"
    )
    lines.append(
        f"goodput from the first step: {report.goodput_from_first_step:.1%} "
        f"({report.useful_seconds:.1f} s useful of {report.wall_from_first_step_seconds:.1f} s wall)"
    )
    if report.goodput_from_submission is not None and report.startup_seconds is not None:
        lines.append(
            f"goodput from submission: {report.goodput_from_submission:.1%} "
            f"({report.useful_seconds:.1f} s useful of {report.wall_seconds:.1f} s wall; "
            f"start-up {report.startup_seconds:.1f} s)"
        )
    known = [(cause, seconds) for cause, seconds in report.lost_time().items() if seconds is not None]
    lines.append("time not training, by cause: " + ", ".join(f"{c} {s:.1f} s" for c, s in known))
    return "\n".join(lines)
