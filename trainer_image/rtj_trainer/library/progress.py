"""Progress reporting: the trainer's side of the "Progress contract" in docs/architecture.md.

Local rank 0 of each worker pod builds a JSON report (:func:`progress_json`, pure) and hands it to the
sinks chosen by ``RTJ_PROGRESS_SINK``: ``endpoint`` (the newest report in the pod-local file
``RTJ_PROGRESS_FILE``, which ``rtj-launch`` serves on the pod's progress port for the operator to
read, with the trainer's Prometheus metrics: ``rtj_trainer.runtime.endpoint``), ``file:<path>`` (one JSON
line per report, for tests and benchmarks) or ``none``, or several of them separated by commas, each
optionally with a cadence of its own (``file:x@2``: at most every 2 s; ``@0``: every report the
trainer makes, one a step). No sink talks to the Kubernetes API: the trainer's ServiceAccount holds
no permission at all. The other sinks' reports are throttled to one per
``RTJ_PROGRESS_INTERVAL_SECONDS`` except on a checkpoint commit, a recovery or the end; the endpoint
file, a local write, gets one at least every second (:data:`LIVE_INTERVAL_SECONDS`) and those at
once. Each throttled report is also kept in
``<checkpoint dir>/progress/node-<n>.json`` so a restarted process continues the counters (restarts,
useful step seconds, samples and tokens, events) and can tell when the fault that restarted it
happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import operator
import os
import re
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from rtj_contract import progress as progress_contract

if TYPE_CHECKING:
    from rtj_trainer.library.env import JobSettings

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = progress_contract.SCHEMA_VERSION
# The version of the library that writes these reports, in each report's `library` field: the
# operator tells a report of the library from the launcher's own view (rtj_trainer.runtime.launcher_view).
LIBRARY_VERSION: Final = "0.5.0"
MAX_EVENTS: Final = 20
# The pod-local file the endpoint sink writes and rtj-launch serves (set by rtj-launch for its children).
PROGRESS_FILE_ENV: Final = "RTJ_PROGRESS_FILE"
SINK_CHOICES: Final = "endpoint, file:<path> or none"
# How often the live sinks (the endpoint file) get a report at most, urgent ones aside: often enough
# for the operator's reads (every 5 s) and Prometheus, without a JSON dump and a file write per step
# (about 0.1-1 ms each, measured on a loaded 2-core machine).
LIVE_INTERVAL_SECONDS: Final = 1.0
# Throughput (samples and tokens per second) is measured over the newest steps' useful time: at least
# this much of it once that much has passed, so one slow step (a data loader's hiccup) moves it little
# and a change of pace shows within about this long.
THROUGHPUT_WINDOW_SECONDS: Final = 30.0
# ...and over at most this many steps, which bounds what very short steps keep in memory.
THROUGHPUT_WINDOW_STEPS: Final = 10_000
# The report's fields (and a checkpoint's) for the script's cumulative counts (Session.step).
WORK_FIELDS: Final = ("samples", "tokens")


def rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass
class RecoveryEvent:
    """One recovery from a fault, as the report's ``events`` carry it (:meth:`Progress.add_event`).

    Public as ``rtj_trainer.RecoveryEvent`` (docs/library.md)."""

    kind: str  # InProcessRestart | InJobRestart
    step: int  # the step training resumed at
    fault_time: float
    recovered_time: float  # when the first step after the fault completed
    steps_lost: int
    resumed_from: str  # memory | checkpoint | scratch

    @classmethod
    def ended_now(
        cls, kind: str, *, fault_time: float, fault_step: int, resumed_step: int, resumed_from: str
    ) -> RecoveryEvent:
        """The recovery that the step completed now ends: the steps done after `resumed_step` up to
        `fault_step`, when the fault came, were lost."""
        return cls(
            kind=kind,
            step=resumed_step,
            fault_time=fault_time,
            recovered_time=time.time(),
            steps_lost=max(0, fault_step - resumed_step),
            resumed_from=resumed_from,
        )

    @property
    def recovery_seconds(self) -> float:
        return max(0.0, self.recovered_time - self.fault_time)

    def to_json(self) -> dict[str, Any]:
        return {
            "time": rfc3339(self.recovered_time),
            "kind": self.kind,
            "step": self.step,
            "recoverySeconds": round(self.recovery_seconds, 3),
            "faultTime": rfc3339(self.fault_time),
            "faultEpoch": self.fault_time,
            "recoveredEpoch": self.recovered_time,
            "stepsLost": self.steps_lost,
            "resumedFrom": self.resumed_from,
        }

    def log_line(self) -> str:
        return (
            f"rtj-recovery: kind={self.kind} resumed_step={self.step} from={self.resumed_from} "
            f"recovery_seconds={self.recovery_seconds:.3f} steps_lost={self.steps_lost}"
        )


def reported_count(field: str, value: object) -> int | None:
    """One step's `samples` or `tokens` as the script passed it: None (not reported) or a whole number
    >= 0 (an int, or an integer scalar such as a NumPy integer or a one-element integer tensor)."""
    if value is None:
        return None
    try:
        count = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None or isinstance(value, bool):
        raise TypeError(f"{field} must be a whole number (an int), got {value!r}")
    if count < 0:
        raise ValueError(f"{field} must be >= 0, got {count}")
    return count


def _saved_count(value: object) -> int | None:
    """A count a report or checkpoint kept; None when absent or not a whole number >= 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclasses.dataclass
class Throughput:
    """Samples and tokens per second of useful step time over the newest steps (at least
    :data:`THROUGHPUT_WINDOW_SECONDS` of it once that much has passed, at most
    :data:`THROUGHPUT_WINDOW_STEPS` steps). Useful step time leaves out what checkpoint saves blocked,
    so a save does not read as a drop in pace."""

    window_seconds: float = THROUGHPUT_WINDOW_SECONDS
    window_steps: int = THROUGHPUT_WINDOW_STEPS
    _steps: deque[tuple[float, int, int]] = dataclasses.field(default_factory=deque)
    _seconds: float = 0.0
    _samples: int = 0
    _tokens: int = 0

    def add(self, seconds: float, samples: int, tokens: int) -> None:
        self._steps.append((seconds, samples, tokens))
        self._seconds, self._samples, self._tokens = (
            self._seconds + seconds,
            self._samples + samples,
            self._tokens + tokens,
        )
        while len(self._steps) > self.window_steps or (
            len(self._steps) > 1 and self._seconds - self._steps[0][0] >= self.window_seconds
        ):
            old_seconds, old_samples, old_tokens = self._steps.popleft()
            self._seconds -= old_seconds
            self._samples -= old_samples
            self._tokens -= old_tokens

    def samples_per_second(self) -> float | None:
        return self._samples / self._seconds if self._seconds > 0 else None

    def tokens_per_second(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 else None


@dataclasses.dataclass
class Progress:
    """What one node reports; the train loop updates it every step.

    Public as ``rtj_trainer.Progress`` (docs/library.md), sent by a :class:`Reporter`."""

    node_rank: int
    train_start_time: float
    step: int = 0
    last_checkpoint_step: int | None = None
    last_checkpoint_time: float | None = None
    restarts_in_process: int = 0
    restarts_in_job: int = 0
    step_time_seconds: float = 0.0
    checkpoint_blocking_seconds: float = 0.0
    useful_step_seconds: float = 0.0
    loss: float | None = None
    finished: bool = False
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # Faults blamed on this node (rtj_trainer.library.node_faults.NodeFaults.summary), None when none.
    node_faults: dict[str, Any] | None = None
    # The samples and tokens of the steps done so far, as the script counts them (Session.step):
    # None until it reports any.
    samples: int | None = None
    tokens: int | None = None
    throughput: Throughput = dataclasses.field(default_factory=Throughput)

    def add_event(self, event: RecoveryEvent) -> None:
        self.events = [*self.events, event.to_json()][-MAX_EVENTS:]

    def count_work(self, seconds: float, *, samples: object = None, tokens: object = None) -> None:
        """One step's useful `seconds` and the `samples` and `tokens` it trained on (None: not
        reported); a count that is not a whole number >= 0 is refused, naming it, before any is kept."""
        step_samples, step_tokens = reported_count("samples", samples), reported_count("tokens", tokens)
        if step_samples is not None:
            self.samples = (self.samples or 0) + step_samples
        if step_tokens is not None:
            self.tokens = (self.tokens or 0) + step_tokens
        self.throughput.add(seconds, step_samples or 0, step_tokens or 0)

    def work_json(self) -> dict[str, int]:
        """`samples` and `tokens`, those the script reported, as a report and a checkpoint keep them."""
        counts = dict(zip(WORK_FIELDS, (self.samples, self.tokens), strict=True))
        return {field: count for field, count in counts.items() if count is not None}

    def resume_work(self, saved: Mapping[str, Any]) -> None:
        """Continue from the counts a report or a checkpoint kept (:meth:`work_json`; absent: none)."""
        self.samples, self.tokens = (_saved_count(saved.get(field)) for field in WORK_FIELDS)

    def throughput_json(self) -> dict[str, float]:
        """`samplesPerSecond` and `tokensPerSecond`, for the counts the script reports, once a step
        took time."""
        rates = {
            "samplesPerSecond": None if self.samples is None else self.throughput.samples_per_second(),
            "tokensPerSecond": None if self.tokens is None else self.throughput.tokens_per_second(),
        }
        return {field: round(rate, 3) for field, rate in rates.items() if rate is not None}


def progress_json(p: Progress, now: float) -> dict[str, Any]:
    """The annotation value (docs/architecture.md, "Progress contract")."""
    last_ckpt: dict[str, Any] | None = None
    if p.last_checkpoint_step is not None:
        last_ckpt = {
            "step": p.last_checkpoint_step,
            "time": rfc3339(p.last_checkpoint_time) if p.last_checkpoint_time is not None else None,
        }
    out: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "library": LIBRARY_VERSION,
        "time": rfc3339(now),
        "nodeRank": p.node_rank,
        "step": p.step,
        "lastCheckpoint": last_ckpt,
        "restarts": {"inProcess": p.restarts_in_process, "inJob": p.restarts_in_job},
        "stepTimeSeconds": round(p.step_time_seconds, 6),
        "checkpointBlockingSeconds": round(p.checkpoint_blocking_seconds, 6),
        "usefulStepSeconds": round(p.useful_step_seconds, 3),
        "trainStartTime": rfc3339(p.train_start_time),
        "finished": p.finished,
        "events": p.events[-MAX_EVENTS:],
    }
    if p.loss is not None:
        out["loss"] = round(p.loss, 6)
    if p.node_faults is not None:
        out["nodeFaults"] = p.node_faults
    return out | p.work_json() | p.throughput_json()


class Sink(Protocol):
    def send(self, report: dict[str, Any]) -> None: ...


class NoSink:
    def send(self, report: dict[str, Any]) -> None:
        return None


class FileSink:
    """Appends one JSON line per report (O_APPEND: nodes may share the file)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def send(self, report: dict[str, Any]) -> None:
        line = (json.dumps(report, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


class EndpointSink:
    """Keeps the newest report in a pod-local file that the pod's progress endpoint serves.

    ``rtj-launch`` (the pod's main process, which outlives every training process) names the file
    in ``RTJ_PROGRESS_FILE`` and serves it on the pod's progress port (``rtj_trainer.runtime.endpoint``);
    the operator reads it from there. The file is replaced atomically, so a reader never sees half a
    report and a crashed writer leaves the last whole one. The Reporter sends this sink more often
    than the others (:attr:`live`: at least every :data:`LIVE_INTERVAL_SECONDS`, and at once on a
    commit, a recovery or the end), so what the endpoint serves is never older than that.
    """

    live: Final = True

    def __init__(self, path: str) -> None:
        if not path:
            raise RuntimeError(f"the endpoint progress sink needs {PROGRESS_FILE_ENV} (set by rtj-launch)")
        self.path = Path(path)
        self._warned = False

    def send(self, report: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(json.dumps(report, separators=(",", ":")))
            os.replace(tmp, self.path)
        except OSError as err:
            # Progress is advisory: a full or vanished directory must not stop training.
            if not self._warned:
                log.warning("progress endpoint file %s not written: %s", self.path, err)
                self._warned = True


class ThrottledSink:
    """Passes a report on at most once per `interval_seconds` (0: every one), except one that changes
    what the operator acts on or shows at once (a checkpoint commit, a restart, a recovery event, a
    fault blamed on the node, the end). A sink's own cadence: the Reporter sends it every report,
    whatever its interval (`SinksByCadence`)."""

    _URGENT_KEYS: Final = ("lastCheckpoint", "restarts", "events", "finished", "nodeFaults")

    def __init__(self, sink: Sink, interval_seconds: float) -> None:
        self.sink = sink
        self.interval = interval_seconds
        self._last_time = float("-inf")
        self._last_urgent: tuple[str, ...] | None = None

    def send(self, report: dict[str, Any]) -> None:
        if self.interval <= 0:
            self.sink.send(report)
            return
        now = time.monotonic()
        urgent = tuple(json.dumps(report.get(key), sort_keys=True) for key in self._URGENT_KEYS)
        if urgent == self._last_urgent and now - self._last_time < self.interval:
            return
        self._last_time, self._last_urgent = now, urgent
        self.sink.send(report)


class MultiSink:
    """Sends each report to several sinks (e.g. the pod annotation and a local timeline file)."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def send(self, report: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.send(report)


_THROTTLE_SUFFIX: Final = re.compile(r"^(?P<sink>.+)@(?P<seconds>\d+(?:\.\d+)?)$")


def _make_one_sink(spec: str, environ: Mapping[str, str]) -> Sink:
    throttled = _THROTTLE_SUFFIX.match(spec)
    if throttled:
        inner = _make_one_sink(throttled["sink"], environ)
        return ThrottledSink(inner, float(throttled["seconds"]))
    if spec == "none":
        return NoSink()
    if spec.startswith("file:"):
        return FileSink(spec[len("file:") :])
    if spec == "endpoint":
        return EndpointSink(environ.get(PROGRESS_FILE_ENV, ""))
    raise ValueError(
        f"RTJ_PROGRESS_SINK={spec!r}: expected {SINK_CHOICES}, "
        "each optionally followed by @<seconds>, several separated by commas"
    )


def make_sink(spec: str, environ: Mapping[str, str] | None = None) -> Sink:
    """The sink(s) named by `RTJ_PROGRESS_SINK`: a comma-separated list of `endpoint`,
    `file:<path>` or `none`, each optionally suffixed `@<seconds>` to throttle that sink on its own
    (e.g. `endpoint,file:/checkpoints/job/progress.jsonl@2`). `environ` (default: the process's)
    supplies `RTJ_PROGRESS_FILE` to the endpoint sink."""
    env = os.environ if environ is None else environ
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"RTJ_PROGRESS_SINK is empty: expected {SINK_CHOICES}")
    sinks = [_make_one_sink(part, env) for part in parts]
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)


@dataclasses.dataclass(frozen=True)
class SinksByCadence:
    """A reporter's sinks by how often each is sent a report: the live ones (the endpoint) at least
    every :data:`LIVE_INTERVAL_SECONDS`; those with their own `@<seconds>` every report the trainer
    makes, which they throttle themselves (`@0`: every step); the rest with the node state, once per
    `RTJ_PROGRESS_INTERVAL_SECONDS`."""

    live: list[Sink]
    own_cadence: list[Sink]
    with_node_state: Sink


def _by_cadence(sink: Sink) -> SinksByCadence:
    sinks = sink.sinks if isinstance(sink, MultiSink) else [sink]
    live = [s for s in sinks if getattr(s, "live", False)]
    own: list[Sink] = [s for s in sinks if isinstance(s, ThrottledSink)]
    rest = [s for s in sinks if s not in live and s not in own]
    return SinksByCadence(live, own, rest[0] if len(rest) == 1 else MultiSink(rest))


def node_state_path(checkpoint_dir: str | os.PathLike[str], node_rank: int) -> Path:
    return Path(checkpoint_dir) / "progress" / f"node-{node_rank}.json"


def load_node_state(checkpoint_dir: str | os.PathLike[str], node_rank: int) -> dict[str, Any] | None:
    """The node's last persisted report (a previous process's: what a restarted one continues), or
    None. Public as ``rtj_trainer.load_node_state`` (docs/library.md)."""
    try:
        loaded: dict[str, Any] = json.loads(node_state_path(checkpoint_dir, node_rank).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def train_start_time(checkpoint_dir: str | os.PathLike[str], now: float) -> float:
    """The job's first start, shared by every node and every restart (first writer wins).

    Public as ``rtj_trainer.train_start_time`` (docs/library.md)."""
    path = Path(checkpoint_dir) / "progress" / "train-start.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump({"time": now}, f)
    for _ in range(50):
        try:
            return float(json.loads(path.read_text())["time"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)  # another node created it and is writing it
    return now


class ReportingLock:
    """Which of a pod's ranks reports: the first to take an exclusive lock next to the pod's report
    file holds it until its process ends, then another active rank takes it over."""

    def __init__(self, report_file: str | None) -> None:
        self.path = Path(f"{report_file}.lock") if report_file else None
        self._fd: int | None = None

    def held(self) -> bool:
        if self.path is None:
            return True
        if self._fd is not None:
            return True
        import fcntl

        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True


class Reporter:
    """Sends reports to its sinks, each at its cadence (:class:`SinksByCadence`), and persists the node
    state with the sinks throttled to the interval.

    Public as ``rtj_trainer.Reporter`` (docs/library.md), made by :meth:`for_pod`."""

    def __init__(
        self,
        sink: Sink,
        checkpoint_dir: str,
        interval_seconds: float,
        *,
        enabled: bool = True,
        live_interval_seconds: float = LIVE_INTERVAL_SECONDS,
        lock: ReportingLock | None = None,
    ) -> None:
        """``lock``: this rank reports while it holds the pod's reporting lock (:attr:`reports`)."""
        self.enabled = enabled  # only local rank 0 of a node reports
        self.lock = lock
        sinks = _by_cadence(sink)
        self.live, self.own_cadence, self.sink = sinks.live, sinks.own_cadence, sinks.with_node_state
        self.checkpoint_dir = checkpoint_dir
        self.interval = interval_seconds
        self.live_interval = min(live_interval_seconds, interval_seconds)
        self._last = float("-inf")
        self._last_live = float("-inf")

    @classmethod
    def for_pod(
        cls,
        settings: JobSettings,
        checkpoint_dir: str,
        *,
        local_rank: int,
        environ: Mapping[str, str] | None = None,
    ) -> Reporter:
        """This rank's reporter for its pod: local rank 0 reports, or under the Supervisor launcher
        (``settings.supervisor_mode``) whichever rank of the pod holds the pod's reporting lock
        (:attr:`reports`), which passes on when its holder's process ends. The sinks are
        ``settings.progress_sink``'s; ``environ`` (default: the process's) names the pod's report file
        (``RTJ_PROGRESS_FILE``)."""
        env = os.environ if environ is None else environ
        supervisor_mode = settings.supervisor_mode
        may_report = local_rank == 0 or supervisor_mode
        return cls(
            make_sink(settings.progress_sink, env) if may_report else NoSink(),
            checkpoint_dir,
            settings.progress_interval_seconds,
            enabled=local_rank == 0 and not supervisor_mode,
            lock=ReportingLock(env.get(PROGRESS_FILE_ENV)) if supervisor_mode else None,
        )

    @property
    def reports(self) -> bool:
        """Whether this rank reports for its pod now: with a lock, whether it holds it (taking it
        when free); without, whether it is :attr:`enabled`."""
        if self.lock is not None:
            self.enabled = self.lock.held()
        return self.enabled

    def report(self, p: Progress, *, force: bool = False) -> bool:
        """Send `p` (`force`: a commit, a recovery, the end); True when it went to the throttled
        sinks and the node state too."""
        now = time.time()
        if not self.enabled:
            return False
        due = force or now - self._last >= self.interval
        live_due = bool(self.live) and (due or now - self._last_live >= self.live_interval)
        if not due and not live_due and not self.own_cadence:
            return False
        report = progress_json(p, now)
        for sink in self.own_cadence:
            sink.send(report)
        if live_due:
            self._last_live = now
            for sink in self.live:
                sink.send(report)
        if not due:
            return False
        self._last = now
        path = node_state_path(self.checkpoint_dir, p.node_rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, path)
        self.sink.send(report)
        return True
