"""Progress reporting: the trainer's side of the "Progress contract" in docs/architecture.md.

Local rank 0 of each worker pod builds a JSON report (:func:`progress_json`, pure) and hands it to a
sink chosen by ``RTJ_PROGRESS_SINK``: ``pod-annotation`` (merge-patch of the annotation
``resilient.training/progress`` on its own pod, through the in-cluster service account, standard
library only), ``file:<path>`` (one JSON line per report, for tests and benchmarks) or ``none``, or
several of them separated by commas, each optionally throttled on its own (``pod-annotation@2``).
Reports are throttled to one per ``RTJ_PROGRESS_INTERVAL_SECONDS`` except on a checkpoint commit, a
recovery or the end. Each report is also kept in ``<checkpoint dir>/progress/node-<n>.json`` so a
restarted process continues the counters (restarts, useful step seconds, events) and can tell when
the fault that restarted it happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

ANNOTATION: Final = "resilient.training/progress"
SCHEMA_VERSION: Final = 1
MAX_EVENTS: Final = 20
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# Optional override of the service-account directory (a local cluster maps volumes elsewhere).
SERVICE_ACCOUNT_DIR_ENV: Final = "RTJ_SERVICE_ACCOUNT_DIR"


def rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass
class RecoveryEvent:
    kind: str  # InProcessRestart | InJobRestart
    step: int  # the step training resumed at
    fault_time: float
    recovered_time: float  # when the first step after the fault completed
    steps_lost: int
    resumed_from: str  # memory | checkpoint | scratch

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


@dataclasses.dataclass
class Progress:
    """What one node reports; the train loop updates it every step."""

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
    # Faults blamed on this node (rtj_trainer.node_faults.NodeFaultLog.summary), None when none.
    node_faults: dict[str, Any] | None = None

    def add_event(self, event: RecoveryEvent) -> None:
        self.events = [*self.events, event.to_json()][-MAX_EVENTS:]


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
    return out


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


class PodAnnotationSink:
    """Merge-patches the progress annotation on the pod's own object through the API server."""

    def __init__(self, namespace: str, pod_name: str, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        host = env.get("KUBERNETES_SERVICE_HOST", "")
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not pod_name:
            raise RuntimeError("pod-annotation progress needs KUBERNETES_SERVICE_HOST and RTJ_POD_NAME")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        sa_dir = Path(env.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR)
        self.url = f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods/{pod_name}"
        self.token_path = sa_dir / "token"
        self.context = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        self._warned = False

    def send(self, report: dict[str, Any]) -> None:
        body = json.dumps({"metadata": {"annotations": {ANNOTATION: json.dumps(report)}}}).encode()
        # The token is re-read each time: projected tokens rotate.
        token = self.token_path.read_text().strip()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="PATCH",
            headers={
                "Content-Type": "application/merge-patch+json",
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=5) as response:
                response.read()
        except (urllib.error.URLError, OSError) as err:
            # Progress is advisory: a slow or restarting API server must not stop training.
            if not self._warned:
                log.warning("progress annotation patch failed: %s", err)
                self._warned = True


class ThrottledSink:
    """Passes a report on at most once per `interval_seconds`, except one that changes what the
    operator acts on or shows at once (a checkpoint commit, a restart, a recovery event, a fault
    blamed on the node, the end)."""

    _URGENT_KEYS: Final = ("lastCheckpoint", "restarts", "events", "finished", "nodeFaults")

    def __init__(self, sink: Sink, interval_seconds: float) -> None:
        self.sink = sink
        self.interval = interval_seconds
        self._last_time = float("-inf")
        self._last_urgent: tuple[str, ...] | None = None

    def send(self, report: dict[str, Any]) -> None:
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


def _make_one_sink(spec: str, namespace: str, pod_name: str) -> Sink:
    throttled = _THROTTLE_SUFFIX.match(spec)
    if throttled:
        inner = _make_one_sink(throttled["sink"], namespace, pod_name)
        return ThrottledSink(inner, float(throttled["seconds"]))
    if spec == "none":
        return NoSink()
    if spec.startswith("file:"):
        return FileSink(spec[len("file:") :])
    if spec == "pod-annotation":
        return PodAnnotationSink(namespace, pod_name)
    raise ValueError(
        f"RTJ_PROGRESS_SINK={spec!r}: expected pod-annotation, file:<path> or none, "
        "each optionally followed by @<seconds>, several separated by commas"
    )


def make_sink(spec: str, namespace: str, pod_name: str) -> Sink:
    """The sink(s) named by `RTJ_PROGRESS_SINK`: a comma-separated list of `pod-annotation`,
    `file:<path>` or `none`, each optionally suffixed `@<seconds>` to throttle that sink on its own
    (e.g. `pod-annotation@2,file:/checkpoints/job/progress.jsonl` with a 0 s report interval: every
    step in the file, the annotation at most every 2 s)."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise ValueError("RTJ_PROGRESS_SINK is empty: expected pod-annotation, file:<path> or none")
    sinks = [_make_one_sink(part, namespace, pod_name) for part in parts]
    return sinks[0] if len(sinks) == 1 else MultiSink(sinks)


def node_state_path(checkpoint_dir: str | os.PathLike[str], node_rank: int) -> Path:
    return Path(checkpoint_dir) / "progress" / f"node-{node_rank}.json"


def load_node_state(checkpoint_dir: str | os.PathLike[str], node_rank: int) -> dict[str, Any] | None:
    try:
        loaded: dict[str, Any] = json.loads(node_state_path(checkpoint_dir, node_rank).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def train_start_time(checkpoint_dir: str | os.PathLike[str], now: float) -> float:
    """The job's first start, shared by every node and every restart (first writer wins)."""
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


class Reporter:
    """Throttles reports to the sink and persists the node state."""

    def __init__(
        self, sink: Sink, checkpoint_dir: str, interval_seconds: float, *, enabled: bool = True
    ) -> None:
        self.enabled = enabled  # only local rank 0 of a node reports
        self.sink = sink
        self.checkpoint_dir = checkpoint_dir
        self.interval = interval_seconds
        self._last = float("-inf")

    def report(self, p: Progress, *, force: bool = False) -> bool:
        now = time.time()
        if not self.enabled or (not force and now - self._last < self.interval):
            return False
        self._last = now
        report = progress_json(p, now)
        path = node_state_path(self.checkpoint_dir, p.node_rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, path)
        self.sink.send(report)
        return True
