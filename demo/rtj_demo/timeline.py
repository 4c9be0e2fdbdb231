"""A rehearsal's timeline, gathered from what each component records, for `report.build_report`.

Sources, all read after (or while) the job runs:

- the trainer's progress file sink (JSON lines, one progress record per line in the shape of the
  progress contract in docs/architecture.md): step completions, committed checkpoints and the
  recovery events the trainer saw (in-process restarts, in-job restarts by ft_launcher);
- the trainer's fault markers (`<checkpoint dir>/faults-fired/*.json`, written by
  `rtj_trainer.rehearsal.fault_injection` just before a planned fault fires): the time and kind of
  each injected fault;
- the operator's Events on the job (`WorkerReplaced`, `GangRestart`): pod replacements and job
  restarts, with their timestamps;
- the rehearsal's own record of faults it injected from outside (a node killed).

Everything is converted to epoch seconds. Parsing is pure: callers read the files and the API.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rtj_contract.times import epoch_seconds

from rtj_demo.report import (
    INTENDED_LAYER,
    LAYER_IN_JOB,
    LAYER_IN_PROCESS,
    LAYER_JOB_RESTART,
    LAYER_POD_REPLACEMENT,
    CheckpointRecord,
    FaultRecord,
    RecoveryRecord,
    RunReport,
    StepRecord,
    build_report,
)

# Trainer recovery-event kinds -> the layer that acted.
TRAINER_EVENT_LAYERS = {
    "InProcessRestart": LAYER_IN_PROCESS,
    "InJobRestart": LAYER_IN_JOB,
}
# Operator Event reasons -> the layer that acted.
OPERATOR_EVENT_LAYERS = {
    "WorkerReplaced": LAYER_POD_REPLACEMENT,
    "GangRestart": LAYER_JOB_RESTART,
}


def record_epoch_seconds(value: Any) -> float | None:
    """A record's time as epoch seconds: an RFC 3339 string (any precision, `Z` or an offset) or a number."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    return epoch_seconds(str(value))


@dataclass
class Timeline:
    """Everything `report.build_report` needs, plus the window the run's wall time is measured in."""

    steps: list[StepRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    recoveries: list[RecoveryRecord] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    start_time: float | None = None
    end_time: float | None = None
    # The seconds training waited on checkpoint saves, as the trainer counted them (its progress
    # records' `checkpointBlockingSeconds`); None when no record said.
    checkpoint_blocking_seconds: float | None = None

    def report(self, intended: Mapping[str, str] = INTENDED_LAYER) -> RunReport:
        """The run's figures, each fault judged against the layer `intended` names for its class."""
        return build_report(
            self.steps,
            self.faults,
            self.recoveries,
            self.checkpoints,
            start_time=self.start_time,
            end_time=self.end_time,
            intended=intended,
            checkpoint_blocking_seconds=self.checkpoint_blocking_seconds,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "start_time": self.start_time,
            "end_time": self.end_time,
            "steps": [[s.time, s.step, s.seconds] for s in self.steps],
            "faults": [{"time": f.time, "kind": f.kind, "step": f.step} for f in self.faults],
            "recoveries": [{"time": r.time, "layer": r.layer} for r in self.recoveries],
            "checkpoints": [[c.time, c.step] for c in self.checkpoints],
            "checkpoint_blocking_seconds": self.checkpoint_blocking_seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Timeline:
        return cls(
            steps=[
                StepRecord(time=r[0], step=r[1], seconds=r[2] if len(r) > 2 else None)
                for r in data.get("steps", [])
            ],
            faults=[
                FaultRecord(time=f["time"], kind=f["kind"], step=f.get("step"))
                for f in data.get("faults", [])
            ],
            recoveries=[RecoveryRecord(time=r["time"], layer=r["layer"]) for r in data.get("recoveries", [])],
            checkpoints=[CheckpointRecord(time=t, step=s) for t, s in data.get("checkpoints", [])],
            start_time=data.get("start_time"),
            end_time=data.get("end_time"),
            checkpoint_blocking_seconds=data.get("checkpoint_blocking_seconds"),
        )

    def extend(self, other: Timeline) -> None:
        self.steps += other.steps
        self.faults += other.faults
        self.recoveries += other.recoveries
        self.checkpoints += other.checkpoints
        if other.checkpoint_blocking_seconds is not None:
            self.checkpoint_blocking_seconds = other.checkpoint_blocking_seconds


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file; a torn last line (the writer was killed) is skipped."""
    records: list[dict[str, Any]] = []
    if not path.is_file():
        return records
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def _step_source(ordered: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records that step completions come from (`ordered` by time): node 0's, and after its last
    report those of the lowest node that went on past node 0's last step. Under the Supervisor
    launcher a lost worker 0's share of the world goes on in a hot spare's pod, whose reports carry
    that pod's own node rank; at the end of a run the other nodes' last reports repeat node 0's."""
    stepping = [r for r in ordered if isinstance(r.get("step"), int) and r["step"] > 0]
    node_0 = [r for r in stepping if r.get("nodeRank", 0) == 0]
    if not node_0:
        return ordered
    gone, last_step = record_epoch_seconds(node_0[-1].get("time")) or 0.0, int(node_0[-1]["step"])
    after = [r for r in stepping if (record_epoch_seconds(r.get("time")) or 0.0) > gone]
    went_on = [r for r in after if int(r["step"]) > last_step]
    if not went_on:
        return node_0
    heir = min(int(r.get("nodeRank", 0)) for r in went_on)
    return node_0 + [r for r in after if r.get("nodeRank", 0) == heir]


def from_progress_records(records: Iterable[Mapping[str, Any]]) -> Timeline:
    """Steps, checkpoints and trainer recovery events from progress records (JSON lines of the file sink).

    Records of several nodes may be mixed in one file. Step completions are taken from one node (the
    nodes step in lockstep), one per change of its step number: a report forced by a checkpoint commit
    or a recovery repeats the step it was made at. That node is node 0 (it holds global rank 0) as
    long as it reports, then the lowest node that reports after it (`_step_source`). Recovery
    events count once per (kind, time): every node reports them, and every record repeats the newest
    20. An event is placed mid-way between its fault and the step that ended its recovery (see
    `_acting_time`).
    """
    ordered = sorted(
        (r for r in records if record_epoch_seconds(r.get("time")) is not None),
        key=lambda r: record_epoch_seconds(r.get("time")) or 0.0,
    )
    timeline = Timeline()
    step_source = _step_source(ordered)
    previous: int | None = None
    for record in step_source:
        step, when = record.get("step"), record_epoch_seconds(record.get("time"))
        if isinstance(step, int) and step > 0 and when is not None and step != previous:
            seconds = record.get("stepTimeSeconds")
            own = float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None
            timeline.steps.append(StepRecord(time=when, step=step, seconds=own))
            previous = step
    seen_events: set[tuple[str, float]] = set()
    seen_ckpts: dict[int, float] = {}
    for record in ordered:
        ckpt = record.get("lastCheckpoint") or {}
        ckpt_step, ckpt_time = ckpt.get("step"), record_epoch_seconds(ckpt.get("time"))
        if isinstance(ckpt_step, int) and ckpt_time is not None:
            seen_ckpts.setdefault(ckpt_step, ckpt_time)
        for event in record.get("events") or []:
            kind = str(event.get("kind"))
            ev_time = _acting_time(event)
            layer = TRAINER_EVENT_LAYERS.get(kind)
            if layer is None or ev_time is None or (kind, round(ev_time, 3)) in seen_events:
                continue
            seen_events.add((kind, round(ev_time, 3)))
            timeline.recoveries.append(RecoveryRecord(time=ev_time, layer=layer))
    timeline.checkpoints = [CheckpointRecord(time=t, step=s) for s, t in sorted(seen_ckpts.items())]
    timeline.recoveries.sort(key=lambda r: r.time)
    timeline.checkpoint_blocking_seconds = _checkpoint_blocking(step_source)
    return timeline


def _checkpoint_blocking(records: Iterable[Mapping[str, Any]]) -> float | None:
    """The most checkpoint blocking any of the records counted (the counter only grows, and a
    restarted process continues it from the node's saved state)."""
    counted = [
        float(r["checkpointBlockingSeconds"])
        for r in records
        if isinstance(r.get("checkpointBlockingSeconds"), int | float)
    ]
    return max(counted) if counted else None


def _acting_time(event: Mapping[str, Any]) -> float | None:
    """When a trainer recovery event's layer acted: mid-way between the fault and the first step
    after it. Not the recovery's end: every node records the event at its own first step, and a node
    whose clock reading comes a few milliseconds after rank 0's step report would otherwise fall
    outside the fault's recovery window."""
    recovered = record_epoch_seconds(event.get("recoveredEpoch")) or record_epoch_seconds(event.get("time"))
    fault = record_epoch_seconds(event.get("faultEpoch")) or record_epoch_seconds(event.get("faultTime"))
    if recovered is None or fault is None or fault > recovered:
        return recovered
    return (fault + recovered) / 2


def faults_from_markers(marker_dir: Path) -> list[FaultRecord]:
    """The faults the trainer fired, from its markers; a fault fired on several ranks counts once."""
    fired: dict[tuple[str, int], float] = {}
    if marker_dir.is_dir():
        for path in sorted(marker_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            kind, step, when = data.get("kind"), data.get("step"), record_epoch_seconds(data.get("time"))
            if not isinstance(kind, str) or when is None:
                continue
            key = (kind, int(step) if isinstance(step, int) else -1)
            fired[key] = min(when, fired.get(key, when))
    return sorted(
        (FaultRecord(time=t, kind=k, step=s if s >= 0 else None) for (k, s), t in fired.items()),
        key=lambda f: f.time,
    )


def align_fault_times(
    steps: Sequence[StepRecord],
    faults: Sequence[FaultRecord],
    *,
    lag_seconds: float = 2.0,
    node_loss_lag_seconds: float = 1.0,
) -> list[FaultRecord]:
    """Move each fault past node 0's reports of steps that were done, or in flight, when it struck.

    A trainer fault fires on one rank at the start of a step, when `fault.step` steps are done;
    global rank 0 may still be saving or reporting the last of them, so its record of a step finished
    *before* the fault can carry a later timestamp: records within `lag_seconds` are matched by step
    number. A lost node dies mid-step: rank 0 can still finish the collectives already under way and
    report the step at once, so records within `node_loss_lag_seconds` of the kill's end
    (`killed_by`; on a loaded machine killing a node's processes takes a while) are taken as in
    flight; no recovery of a lost node is that fast (in-process under the Supervisor launcher it
    takes seconds: the survivors' collectives fail, the world re-forms, the replicas move). Without
    this, such a record would pass for the first step after the fault (a recovery of 0 s by no
    layer).
    """
    ordered = sorted(steps, key=lambda s: s.time)
    aligned: list[FaultRecord] = []
    for fault in faults:
        when = fault.time
        if fault.step is not None:
            until = fault.time + lag_seconds
        else:
            until = max(fault.time, fault.killed_by or fault.time) + node_loss_lag_seconds
        if fault.step is not None or fault.kind == "node-loss":
            for record in ordered:
                if record.time < fault.time:
                    continue
                if record.time > until:
                    break
                if fault.step is not None and record.step > fault.step:
                    break
                when = record.time
        aligned.append(replace(fault, time=when))
    return aligned


def recoveries_from_events(events: Iterable[Mapping[str, Any]]) -> list[RecoveryRecord]:
    """Pod replacements and job restarts from the operator's Events (dicts as the API returns them)."""
    out: list[RecoveryRecord] = []
    for event in events:
        layer = OPERATOR_EVENT_LAYERS.get(str(event.get("reason")))
        if layer is None:
            continue
        meta = event.get("metadata") or {}
        when = (
            record_epoch_seconds(event.get("eventTime"))
            or record_epoch_seconds(event.get("lastTimestamp"))
            or record_epoch_seconds(event.get("firstTimestamp"))
            or record_epoch_seconds(meta.get("creationTimestamp"))
        )
        if when is not None:
            out.append(RecoveryRecord(time=when, layer=layer))
    return sorted(out, key=lambda r: r.time)
