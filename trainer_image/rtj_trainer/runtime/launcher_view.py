"""The launcher view of a pod's ranks, and the report its progress endpoint serves (pure).

``rtj_trainer.runtime.rankshim`` keeps one JSON record per rank process; ``rtj-launch`` keeps every record it
has seen across ft_launcher's restarts (``rtj_trainer.runtime.launch.RankHistory``) and derives from them,
with the functions here, what a training script of the user's own does not report itself:

* :func:`launcher_view`: ranks running, in-job restarts (one per generation of rank processes after
  the first) with a recovery event each, and the step and loss the log-line pattern matched;
* :func:`startup_failure`: two generations in a row that failed the same way before their first
  step, which ``rtj-launch`` turns into exit ``termination.STARTUP_FAILURE_EXIT_CODE`` and a termination
  message the operator fails the job on at once;
* :func:`repeated_failure`: two generations in a row that failed the same way after the same step
  (a deterministic failure: a bug that raises at that step, a corrupt sample), which ``rtj-launch``
  turns into exit ``termination.NO_RESTART_EXIT_CODE`` and a termination message the operator fails the job
  on at once (``DeterministicFailure``);
* :func:`merge`: the report ``GET /progress`` serves (docs/architecture.md, "Progress contract"):
  the library's report (``rtj_trainer.library.progress``) wins for every field it has; the launcher view
  fills in the rest, and ``sources`` says where the step and the restarts come from.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final

from rtj_contract import termination

from rtj_trainer.library import drain, failed_step
from rtj_trainer.library.progress import MAX_EVENTS, SCHEMA_VERSION, rfc3339

# Generations in a row that must fail the same way before their first step.
STARTUP_FAILURE_TRIES: Final = 2
# Without a step pattern nothing tells a start from training: only a failure this soon after its
# generation started counts as a failure to start.
STARTUP_WINDOW_SECONDS: Final = 120.0
# A rank's status when SIGTERM ended it: ft_launcher stopping its workers for a restart that another
# rank, another node or a node joining caused. No failure of the command's own to start.
STOPPED_EXIT_CODE: Final = 128 + signal.SIGTERM

# Generations in a row that must fail the same way after the same step.
DETERMINISTIC_FAILURE_TRIES: Final = 2
# A rank's status when it left for a drain (its own pod's: 143, a peer's: 75): never its failure.
DRAIN_EXIT_CODES: Final = frozenset({128 + signal.SIGTERM, 75})
# Numbers, hexadecimal ones (an address) whole: what differs between two tries of one failure.
_NUMBERS: Final = re.compile(r"0x[0-9a-fA-F]+|\d+")

SOURCE_LIBRARY: Final = "Library"
SOURCE_LOG_PATTERN: Final = "LogPattern"
SOURCE_NOT_REPORTED: Final = "NotReported"
SOURCE_LAUNCHER: Final = "Launcher"
IN_JOB_RESTART: Final = "InJobRestart"


def cannot_start(message: str) -> int:
    """End a pod whose program cannot start as configured: the termination message tells the operator
    (``FaultReason: StartupFailed``, then ``message``), which fails the job at once instead of
    restarting it until its budget is spent. Returns the pod's exit status."""
    drain.write_termination_message(termination.fault_message(termination.STARTUP_FAILED, message))
    return termination.STARTUP_FAILURE_EXIT_CODE


@dataclasses.dataclass(frozen=True)
class RankRecord:
    """One rank process as its shim last wrote it (rtj_trainer.runtime.rankshim.RankRecord)."""

    local_rank: int
    pid: int
    start_epoch: float
    restart_count: int = 0
    step: int | None = None
    loss: float | None = None
    step_epoch: float | None = None
    first_step: int | None = None
    first_step_epoch: float | None = None
    exit_code: int | None = None
    end_epoch: float | None = None
    last_error_lines: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[int, int]:
        return (self.local_rank, self.pid)

    @property
    def running(self) -> bool:
        return self.end_epoch is None

    @property
    def failed(self) -> bool:
        return self.exit_code is not None and self.exit_code != 0

    @property
    def last_error_line(self) -> str:
        return self.last_error_lines[-1] if self.last_error_lines else ""


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _integer(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def parse_record(local_rank: int, data: object) -> RankRecord | None:
    """The record in a rank file's JSON, None when it is not one (a malformed field reads as absent,
    a missing pid or start as no record)."""
    if not isinstance(data, Mapping):
        return None
    pid, start = _integer(data.get("pid")), _number(data.get("startEpoch"))
    if pid is None or start is None:
        return None
    lines = data.get("lastErrorLines")
    return RankRecord(
        local_rank=local_rank,
        pid=pid,
        start_epoch=start,
        restart_count=_integer(data.get("restartCount")) or 0,
        step=_integer(data.get("step")),
        loss=_number(data.get("loss")),
        step_epoch=_number(data.get("stepEpoch")),
        first_step=_integer(data.get("firstStep")),
        first_step_epoch=_number(data.get("firstStepEpoch")),
        exit_code=_integer(data.get("exitCode")),
        end_epoch=_number(data.get("endEpoch")),
        last_error_lines=tuple(str(x) for x in lines) if isinstance(lines, list) else (),
    )


def settled(records: Iterable[RankRecord]) -> list[RankRecord]:
    """The records, oldest first, where a process that a newer one of the same local rank replaced
    counts as ended when the newer one started (its shim may have died before its exit record, or
    the newer record replaced the file before rtj-launch read the exit)."""
    ordered = sorted(records, key=lambda r: (r.start_epoch, r.local_rank, r.pid))
    out: list[RankRecord] = []
    for index, record in enumerate(ordered):
        successor = next((r for r in ordered[index + 1 :] if r.local_rank == record.local_rank), None)
        if record.running and successor is not None:
            end = max(record.start_epoch, successor.start_epoch)
            out.append(dataclasses.replace(record, end_epoch=end))
        else:
            out.append(record)
    return out


def generations(records: Iterable[RankRecord]) -> list[list[RankRecord]]:
    """The records grouped into generations, oldest first: the rank processes ft_launcher started
    together. A generation shares one ``restartCount``; a local rank seen again under the same count
    (a restart for a membership change keeps torchelastic's count, and without the variable the
    count is always 0) starts the next one."""
    ordered = sorted(settled(records), key=lambda r: (r.restart_count, r.start_epoch, r.local_rank))
    out: list[list[RankRecord]] = []
    for record in ordered:
        current = out[-1] if out else None
        if (
            current is None
            or record.restart_count != current[0].restart_count
            or any(r.local_rank == record.local_rank for r in current)
        ):
            out.append([record])
        else:
            current.append(record)
    return out


def _start(generation: Sequence[RankRecord]) -> float:
    return min(r.start_epoch for r in generation)


def _first_step(generation: Sequence[RankRecord]) -> RankRecord | None:
    stepped = [r for r in generation if r.first_step_epoch is not None]
    return min(stepped, key=lambda r: r.first_step_epoch or 0.0) if stepped else None


def _fault_epoch(previous: Sequence[RankRecord]) -> float | None:
    """When the previous generation's fault happened: its first failure's end, else its first end."""
    failed = [r.end_epoch for r in previous if r.failed and r.end_epoch is not None]
    ended = [r.end_epoch for r in previous if r.end_epoch is not None]
    return min(failed or ended) if (failed or ended) else None


def recovery_event(
    previous: Sequence[RankRecord], current: Sequence[RankRecord], *, step_pattern_set: bool
) -> dict[str, Any] | None:
    """The recovery from `previous` to `current` (the shape of progress.RecoveryEvent.to_json, with
    ``source``), or None while it is not over: with a step pattern, a recovery ends at the new
    generation's first step; without one, when its ranks started."""
    first = _first_step(current)
    if step_pattern_set:
        if first is None or first.first_step_epoch is None:
            return None
        recovered = first.first_step_epoch
    else:
        recovered = _start(current)
    fault = _fault_epoch(previous)
    fault = min(fault, recovered) if fault is not None else _start(current)
    return {
        "time": rfc3339(recovered),
        "kind": IN_JOB_RESTART,
        "step": first.first_step if first is not None else None,
        "recoverySeconds": round(max(0.0, recovered - fault), 3),
        "faultTime": rfc3339(fault),
        "faultEpoch": fault,
        "recoveredEpoch": recovered,
        "stepsLost": None,
        "resumedFrom": "unknown",
        "source": SOURCE_LAUNCHER,
    }


@dataclasses.dataclass(frozen=True)
class LauncherView:
    """What rtj-launch knows of its ranks without the library."""

    running: int = 0
    start_epoch: float | None = None  # the newest generation's first start
    restart_count: int = 0  # the highest TORCHELASTIC_RESTART_COUNT seen
    in_job_restarts: int = 0
    events: tuple[dict[str, Any], ...] = ()
    step: int | None = None
    loss: float | None = None

    def ranks_json(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "startTime": rfc3339(self.start_epoch) if self.start_epoch is not None else None,
            "restartCount": self.restart_count,
        }


def _last_step(records: Sequence[RankRecord]) -> RankRecord | None:
    """Local rank 0's newest matched step, else any local rank's."""
    stepped = [r for r in records if r.step is not None]
    preferred = [r for r in stepped if r.local_rank == 0] or stepped
    return max(preferred, key=lambda r: (r.step_epoch or 0.0, r.start_epoch)) if preferred else None


def launcher_view(records: Iterable[RankRecord], *, step_pattern_set: bool) -> LauncherView:
    """The view of every record seen so far (pure)."""
    gens = generations(records)
    if not gens:
        return LauncherView()
    flat = [r for generation in gens for r in generation]
    events = [
        event
        for previous, current in itertools.pairwise(gens)
        if (event := recovery_event(previous, current, step_pattern_set=step_pattern_set)) is not None
    ]
    stepped = _last_step(flat)
    return LauncherView(
        running=sum(1 for r in flat if r.running),
        start_epoch=_start(gens[-1]),
        restart_count=max(r.restart_count for r in flat),
        in_job_restarts=len(gens) - 1,
        events=tuple(events[-MAX_EVENTS:]),
        step=stepped.step if stepped is not None else None,
        loss=stepped.loss if stepped is not None else None,
    )


@dataclasses.dataclass(frozen=True)
class StartupFailure:
    """The same failure on :data:`STARTUP_FAILURE_TRIES` generations in a row, before any step."""

    exit_code: int
    last_error_line: str
    # What rtj-launch exits with on this verdict.
    pod_exit_code: ClassVar[int] = termination.STARTUP_FAILURE_EXIT_CODE

    @property
    def message(self) -> str:
        """The container's termination message (the operator reads its first line)."""
        return termination.fault_message(
            termination.STARTUP_FAILED,
            f"the training command failed the same way on {STARTUP_FAILURE_TRIES} tries before its "
            f"first step: exit {self.exit_code}: {self.last_error_line or '(nothing on stderr)'}",
        )


def _early_failure(
    generation: Sequence[RankRecord], *, step_pattern_set: bool, library_report_epoch: float | None
) -> StartupFailure | None:
    """How `generation` failed when it failed before any of its ranks matched a step or the library
    wrote a report (and, without a pattern, within STARTUP_WINDOW_SECONDS of its start); a rank that
    SIGTERM stopped does not count."""
    failures = [
        r for r in generation if r.failed and r.exit_code != STOPPED_EXIT_CODE and r.end_epoch is not None
    ]
    if not failures or _first_step(generation) is not None:
        return None
    if library_report_epoch is not None and library_report_epoch >= _start(generation):
        return None  # the library reported since this generation started: it got past its start
    first = min(failures, key=lambda r: r.end_epoch or 0.0)
    assert first.exit_code is not None and first.end_epoch is not None
    if not step_pattern_set and first.end_epoch - _start(generation) > STARTUP_WINDOW_SECONDS:
        return None
    return StartupFailure(first.exit_code, first.last_error_line)


def startup_failure(
    records: Iterable[RankRecord], *, step_pattern_set: bool, library_report_epoch: float | None = None
) -> StartupFailure | None:
    """The failure when the newest generations failed the same way before their first step.

    `library_report_epoch`: when the library last wrote its report (None: never), so that a script
    that reports through the library, not a log line, counts as started once it reported. Only the
    newest :data:`STARTUP_FAILURE_TRIES` generations are judged: rtj-launch judges after every read
    of the records, so each is judged while it is the newest, which the library's newest report
    alone can tell apart (a generation reported when that report is newer than its start; the one
    before it, when the one after it did not).
    """
    gens = generations(records)
    if len(gens) < STARTUP_FAILURE_TRIES:
        return None
    outcomes = [
        _early_failure(g, step_pattern_set=step_pattern_set, library_report_epoch=library_report_epoch)
        for g in gens[-STARTUP_FAILURE_TRIES:]
    ]
    first = outcomes[0]
    return first if first is not None and all(outcome == first for outcome in outcomes) else None


@dataclasses.dataclass(frozen=True)
class RepeatedFailure:
    """The same failure after the same step on :data:`DETERMINISTIC_FAILURE_TRIES` generations in a row."""

    exit_code: int
    step: int
    error_line: str
    # What rtj-launch exits with on this verdict.
    pod_exit_code: ClassVar[int] = termination.NO_RESTART_EXIT_CODE

    @property
    def message(self) -> str:
        """The container's termination message (the operator reads its first line)."""
        return termination.fault_message(
            termination.DETERMINISTIC_FAILURE,
            f"the training failed the same way after step {self.step} on {DETERMINISTIC_FAILURE_TRIES} "
            f"tries in a row: exit {self.exit_code}: {self.error_line or '(nothing on stderr)'}",
        )

    def same_as(self, other: RepeatedFailure) -> bool:
        """The same exit code and step, and the same error line but for its numbers (an address or a
        process id differs from one try to the next; the step is compared apart)."""
        same_error = _NUMBERS.sub("#", self.error_line) == _NUMBERS.sub("#", other.error_line)
        return same_error and (self.exit_code, self.step) == (other.exit_code, other.step)


def _failed_after_a_step(
    generation: Sequence[RankRecord], *, step_pattern_set: bool
) -> RepeatedFailure | None:
    """How `generation` failed, when its first failing rank says after which step: the library's note
    on its exception (`failed_step`), else, with a step pattern, the last step that rank printed.
    Ranks stopped by SIGTERM or gone for a drain are not judged; a generation whose first failure is a
    death by a signal (SIGKILL, a lost peer's NCCL abort) is not either, nor what followed from it."""
    failures = [
        r for r in generation if r.failed and r.end_epoch is not None and r.exit_code not in DRAIN_EXIT_CODES
    ]
    if not failures:
        return None
    first = min(failures, key=lambda r: r.end_epoch or 0.0)
    if first.exit_code is None or first.exit_code >= 128:
        return None
    step = failed_step.step_in(first.last_error_lines)
    if step is None and step_pattern_set:
        step = first.step
    if step is None:
        return None
    lines = [line for line in first.last_error_lines if not failed_step.is_note(line)]
    return RepeatedFailure(first.exit_code, step, lines[-1] if lines else "")


def repeated_failure(records: Iterable[RankRecord], *, step_pattern_set: bool) -> RepeatedFailure | None:
    """The newest failure that ends :data:`DETERMINISTIC_FAILURE_TRIES` consecutive generations failing
    the same way after the same step, or None (pure).

    A failure at another step, or another failure in between, starts the count again. Every run of
    consecutive generations is judged, not only the newest: a script that fails within a second is
    restarted by ft_launcher before rtj-launch's next read, so the generation after the two may be
    running already; it is the third try, and the two before it decided.
    """
    outcomes = [_failed_after_a_step(g, step_pattern_set=step_pattern_set) for g in generations(records)]
    tries = DETERMINISTIC_FAILURE_TRIES
    for end in range(len(outcomes), tries - 1, -1):
        run = outcomes[end - tries : end]
        last = run[-1]
        if last is not None and all(outcome is not None and outcome.same_as(last) for outcome in run):
            return last
    return None


def merge(
    library: Mapping[str, Any] | None,
    view: LauncherView | None,
    *,
    now: float,
    node_rank: int,
    launch_start: float,
) -> dict[str, Any] | None:
    """The report to serve: the library's report (None: none yet) with the launcher's view (None:
    no rank records are kept, as in the direct and supervisor modes); None when there is neither.

    The library wins for every field it has. Always added: ``sources`` and, with a view, ``ranks``.
    Without a library report the view supplies ``step``/``loss`` (when the pattern matched), the
    restarts (in-job only), the recovery events and the rest of the required fields; nothing is
    said about checkpoints.
    """
    if library is None and view is None:
        return None
    if library is not None:
        out = dict(library)
    else:
        assert view is not None
        out = {
            "v": SCHEMA_VERSION,
            "time": rfc3339(now),
            "nodeRank": node_rank,
            "restarts": {"inProcess": 0, "inJob": view.in_job_restarts},
            "events": list(view.events),
            "finished": False,
            "trainStartTime": rfc3339(launch_start),
        }
    step_source = SOURCE_LIBRARY if "step" in out else SOURCE_NOT_REPORTED
    if step_source == SOURCE_NOT_REPORTED and view is not None and view.step is not None:
        step_source = SOURCE_LOG_PATTERN
        out["step"] = view.step
        if view.loss is not None and "loss" not in out:
            out["loss"] = view.loss
    if view is not None:
        out["ranks"] = view.ranks_json()
    out["sources"] = {
        "step": step_source,
        "restarts": SOURCE_LIBRARY if library is not None and "restarts" in library else SOURCE_LAUNCHER,
    }
    return out


def fingerprint(report: Mapping[str, Any] | None) -> str | None:
    """What a reader learns from `report`, less its ``time``: two reports alike here say the same."""
    if report is None:
        return None
    return json.dumps({k: v for k, v in report.items() if k != "time"}, sort_keys=True, default=str)
