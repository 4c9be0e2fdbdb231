"""What `rtj bench scale` measures with, beside the operator: the wall times at which it saw pods,
nodes and Events change (through watches, since the objects' own timestamps have whole seconds),
the API server's request counters by verb and resource, and the operator process's CPU, memory and
metrics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rtj_localcluster.client import ApiError, KubeClient, path_for
from rtj_localcluster.loop_thread import LoopThread
from rtj_operator import constants, events

EVENT_NODE = re.compile(r"\bnode ([a-z0-9][a-z0-9.-]*[a-z0-9])")
REQUEST_LINE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class PodSeen:
    """One pod (one uid) as the watch saw it; times are `time.time()` of the watch event."""

    name: str
    job: str
    role: str
    index: str
    created: float
    node: str = ""
    running: float | None = None
    deleted: float | None = None


class Recorder:
    """Watches the benchmark's namespace (pods, Events) and the nodes from its own thread."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self._client = KubeClient.from_kubeconfig(kubeconfig, user_agent="rtj-bench-scale")
        self._namespace = namespace
        self._loop = LoopThread("rtj-bench-scale-watch")
        self.pods: dict[str, PodSeen] = {}
        self.not_ready: dict[str, float] = {}
        self.node_lost: dict[str, list[float]] = {}  # node -> times of the NodeLost Events naming it
        self.events_seen = 0

    def start(self) -> None:
        self._loop.start()
        self._loop.call(self._spawn())

    async def _spawn(self) -> None:
        self._loop.spawn(self._follow(path_for("pods", self._namespace), self._pod), "pods")
        self._loop.spawn(self._follow(path_for("nodes"), self._node), "nodes")
        self._loop.spawn(self._follow(path_for("events", self._namespace), self._event), "events")

    def stop(self) -> None:
        async def last() -> None:
            await self._loop.cancel_tasks()
            await self._client.close()

        self._loop.stop(last)

    async def _follow(self, path: str, seen: Callable[[str, dict[str, Any], float], None]) -> None:
        while True:
            try:
                listing = await self._client.get(path)
                for item in listing.get("items") or []:
                    seen("ADDED", item, time.time())
                version = str(listing["metadata"]["resourceVersion"])
                while True:
                    async for event in self._client.watch(path, version):
                        kind, obj = event.get("type", ""), event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code", 500)), str(obj))
                        version = str(obj.get("metadata", {}).get("resourceVersion", version))
                        if kind != "BOOKMARK":
                            seen(kind, obj, time.time())
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken watch: list again, as an informer does
                await asyncio.sleep(0.5)

    def _pod(self, kind: str, pod: dict[str, Any], now: float) -> None:
        metadata = pod.get("metadata", {})
        labels = metadata.get("labels") or {}
        uid = str(metadata.get("uid"))
        seen = self.pods.get(uid)
        if seen is None:
            seen = PodSeen(
                str(metadata.get("name")),
                str(labels.get(constants.LABEL_JOB, "")),
                str(labels.get(constants.LABEL_ROLE, "")),
                str(labels.get(constants.LABEL_WORKER_INDEX, "")),
                created=now,
            )
            self.pods[uid] = seen
        seen.node = str(pod.get("spec", {}).get("nodeName") or seen.node)
        if seen.running is None and pod.get("status", {}).get("phase") == "Running":
            seen.running = now
        if kind == "DELETED":
            seen.deleted = now

    def _node(self, kind: str, node: dict[str, Any], now: float) -> None:
        name = str(node.get("metadata", {}).get("name"))
        ready = next(
            (
                c.get("status")
                for c in node.get("status", {}).get("conditions") or []
                if c.get("type") == "Ready"
            ),
            None,
        )
        if ready == "True" and kind != "DELETED":
            self.not_ready.pop(name, None)
        else:
            self.not_ready.setdefault(name, now)

    def _event(self, kind: str, event: dict[str, Any], now: float) -> None:
        self.events_seen += kind == "ADDED"
        if event.get("reason") != events.NODE_LOST:
            return
        found = EVENT_NODE.search(str(event.get("message") or ""))
        if found:
            self.node_lost.setdefault(found.group(1), []).append(now)

    def node_lost_after(self, node: str, since: float) -> float | None:
        """When the first NodeLost Event naming `node` after `since` was seen."""
        return next((t for t in self.node_lost.get(node, []) if t >= since), None)

    def live_workers(self, job: str) -> dict[str, PodSeen]:
        """Worker index -> the job's newest worker pod that is not deleted."""
        found: dict[str, PodSeen] = {}
        for pod in list(self.pods.values()):  # a copy made at once: the watch thread adds pods
            live = pod.job == job and pod.role == constants.ROLE_WORKER and pod.deleted is None
            if live and (pod.index not in found or pod.created > found[pod.index].created):
                found[pod.index] = pod
        return found


def api_request_counts(client_get: Callable[[], str]) -> dict[str, float]:
    """`apiserver_request_total` summed by "VERB resource[/subresource]"."""
    counts: dict[str, float] = {}
    for line in client_get().splitlines():
        found = REQUEST_LINE.match(line)
        if not found:
            continue
        labels = dict(LABEL.findall(found.group(1)))
        resource = labels.get("resource", "") + (
            f"/{labels['subresource']}" if labels.get("subresource") else ""
        )
        key = f"{labels.get('verb', '')} {resource}"
        counts[key] = counts.get(key, 0.0) + float(found.group(2))
    return counts


def rates(
    before: Mapping[str, float], after: Mapping[str, float], seconds: float, top: int = 12
) -> dict[str, float]:
    """Per-second rates of the counters that grew most, highest first."""
    grown = {key: (after[key] - before.get(key, 0.0)) / seconds for key in after}
    ordered = sorted(((v, k) for k, v in grown.items() if v > 0), reverse=True)[:top]
    return {key: round(value, 2) for value, key in ordered}


def start_operator(kubeconfig: str, namespace: str, metrics_port: int, log: Path) -> subprocess.Popen[bytes]:
    """`rtj operator` as its own process (its CPU and memory its own), serving `namespace`, its log
    in `log`."""
    command = [str(Path(sys.executable).parent / "rtj"), "operator", "--kubeconfig", kubeconfig]
    command += ["--namespace", namespace, "--metrics-port", str(metrics_port)]
    with log.open("w") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


def operator_metrics(port: int) -> dict[str, float]:
    """The operator's own series (`rtj_*`) from its metrics endpoint, by sample name and labels."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("rtj_") and " " in line:
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


class OperatorProbe:
    """The operator process: CPU seconds, resident memory and its Prometheus metrics."""

    def __init__(self, pid: int, metrics_port: int) -> None:
        self.process = psutil.Process(pid)
        self.metrics_port = metrics_port

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def rss_mib(self) -> float:
        return round(float(self.process.memory_info().rss) / 2**20, 1)

    def metrics(self) -> dict[str, float]:
        return operator_metrics(self.metrics_port)

    def writes(self) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith("rtj_api_writes_total{"))

    def totals(self, histogram: str) -> tuple[float, float]:
        """(sum of seconds, count) of one of the operator's histograms so far."""
        values = self.metrics()
        return values.get(f"{histogram}_sum", 0.0), values.get(f"{histogram}_count", 0.0)
