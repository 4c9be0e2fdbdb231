"""A node's resource metrics, as a kubelet serves them at ``/metrics/resource``: per container and per
pod the CPU seconds used so far and the memory working set, per node the same summed, in the
Prometheus text format with each sample's time (what metrics-server scrapes, and what the local
cluster's Metrics API, ``rtj_localcluster.metrics_api``, reads).

A container's processes are found by the marks in their environment (``rtj_localcluster.marks``), as
a runtime finds them by their cgroup: its CPU seconds are the user and system time of its live
processes and of the children they reaped, its working set their resident memory. A simulated node
has no machine of its own, so its usage is its containers': its CPU counter adds what each container
used since the last scan (it never goes back when a pod ends), its working set is their sum.

One scan of the machine's processes serves every node of the process for ``SCAN_TTL_SECONDS``: the
kubelets of one cluster are scraped one after the other.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import psutil
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

SCAN_TTL_SECONDS = 1.0

# The series a kubelet's /metrics/resource serves (the names metrics-server reads).
NODE_CPU = "node_cpu_usage_seconds"
NODE_MEMORY = "node_memory_working_set_bytes"
CONTAINER_CPU = "container_cpu_usage_seconds"
CONTAINER_MEMORY = "container_memory_working_set_bytes"
CONTAINER_START = "container_start_time_seconds"
POD_CPU = "pod_cpu_usage_seconds"
POD_MEMORY = "pod_memory_working_set_bytes"
SCRAPE_ERROR = "resource_scrape_error"


@dataclass
class Usage:
    """What a set of processes used: CPU seconds so far and resident bytes now."""

    cpu_seconds: float = 0.0
    memory_bytes: int = 0

    def add(self, other: Usage) -> None:
        self.cpu_seconds += other.cpu_seconds
        self.memory_bytes += other.memory_bytes


@dataclass(frozen=True)
class ContainerSample:
    """One running container's usage, named as the kubelet's series label it."""

    namespace: str
    pod: str
    container: str
    start_time: float
    usage: Usage


def process_usage(proc: psutil.Process) -> Usage:
    """One process's CPU seconds (its own and its reaped children's) and resident memory."""
    with proc.oneshot():
        times = proc.cpu_times()
        rss = proc.memory_info().rss
    return Usage(times.user + times.system + times.children_user + times.children_system, rss)


class MachineScan:
    """Every marked process's usage by its environment's marks, scanned at most once per TTL.
    ``marks`` name the node, the pod's uid and the container, in that order."""

    def __init__(self, marks: tuple[str, ...], ttl_seconds: float = SCAN_TTL_SECONDS) -> None:
        self.marks = marks
        self._ttl = ttl_seconds
        self._lock = threading.Lock()
        self._taken = float("-inf")
        self._processes: list[tuple[dict[str, str], Usage]] = []

    def processes(self) -> list[tuple[dict[str, str], Usage]]:
        """(the process's values of the marks, its usage) for each process carrying the first mark."""
        with self._lock:
            if time.monotonic() - self._taken > self._ttl:
                self._processes = list(_scan(self.marks))
                self._taken = time.monotonic()
            return self._processes


def _scan(marks: tuple[str, ...]) -> Iterator[tuple[dict[str, str], Usage]]:
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if marks[0] not in env:
                continue
            yield {mark: env.get(mark, "") for mark in marks}, process_usage(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue


def usage_by_key(
    processes: Iterable[tuple[Mapping[str, str], Usage]], key_of: Callable[[Mapping[str, str]], str | None]
) -> dict[str, Usage]:
    """The processes' usage summed by ``key_of`` their marks (None: not counted)."""
    totals: dict[str, Usage] = {}
    for marks, usage in processes:
        key = key_of(marks)
        if key is not None:
            totals.setdefault(key, Usage()).add(usage)
    return totals


class NodeCpuCounter:
    """A node's CPU seconds: what its containers used, kept when a container ends."""

    def __init__(self) -> None:
        self.total = 0.0
        self._last: dict[str, float] = {}

    def update(self, cpu_by_container: Mapping[str, float]) -> float:
        for key, seconds in cpu_by_container.items():
            self.total += max(0.0, seconds - self._last.get(key, 0.0))
        self._last = dict(cpu_by_container)
        return self.total


class _ResourceCollector(Collector):
    def __init__(self, node_cpu: float, containers: list[ContainerSample], timestamp: float) -> None:
        self._node_cpu = node_cpu
        self._containers = containers
        self._timestamp = timestamp

    def collect(self) -> Iterator[Metric]:
        ts = self._timestamp
        node_cpu = CounterMetricFamily(NODE_CPU, "Cumulative CPU used by the node's containers.")
        node_cpu.add_metric([], self._node_cpu, timestamp=ts)
        node_memory = GaugeMetricFamily(NODE_MEMORY, "The node's containers' working set.")
        node_memory.add_metric([], sum(c.usage.memory_bytes for c in self._containers), ts)
        labels = ["container", "namespace", "pod"]
        container_cpu = CounterMetricFamily(
            CONTAINER_CPU, "Cumulative CPU used by the container.", labels=labels
        )
        container_memory = GaugeMetricFamily(CONTAINER_MEMORY, "The container's working set.", labels=labels)
        container_start = GaugeMetricFamily(CONTAINER_START, "When the container started.", labels=labels)
        pods: dict[tuple[str, str], Usage] = {}
        for c in self._containers:
            values = [c.container, c.namespace, c.pod]
            container_cpu.add_metric(values, c.usage.cpu_seconds, timestamp=ts)
            container_memory.add_metric(values, c.usage.memory_bytes, ts)
            container_start.add_metric(values, c.start_time, ts)
            pods.setdefault((c.namespace, c.pod), Usage()).add(c.usage)
        pod_cpu = CounterMetricFamily(POD_CPU, "Cumulative CPU used by the pod.", labels=["namespace", "pod"])
        pod_memory = GaugeMetricFamily(POD_MEMORY, "The pod's working set.", labels=["namespace", "pod"])
        for (namespace, pod), usage in sorted(pods.items()):
            pod_cpu.add_metric([namespace, pod], usage.cpu_seconds, timestamp=ts)
            pod_memory.add_metric([namespace, pod], usage.memory_bytes, ts)
        error = GaugeMetricFamily(SCRAPE_ERROR, "1 if there was an error while getting container metrics.")
        error.add_metric([], 0)
        yield from (
            node_cpu,
            node_memory,
            container_cpu,
            container_memory,
            container_start,
            pod_cpu,
            pod_memory,
        )
        yield error


def exposition(node_cpu: float, containers: list[ContainerSample], timestamp: float) -> bytes:
    """The ``/metrics/resource`` page (Prometheus text format) for a node and its containers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ResourceCollector(node_cpu, containers, timestamp))
    return generate_latest(registry)


@dataclass(frozen=True)
class RunningContainer:
    """A container a kubelet runs, as its resource endpoint names it."""

    namespace: str
    pod: str
    uid: str
    container: str
    start_time: float


class ResourceEndpoint:
    """A kubelet's ``/metrics/resource``: its running containers' usage from the machine scan."""

    def __init__(self, node: str, running: Callable[[], list[RunningContainer]], scan: MachineScan) -> None:
        self._node = node
        self._running = running
        self._scan = scan
        self._node_cpu = NodeCpuCounter()

    def route(self) -> web.RouteDef:
        return web.get("/metrics/resource", self._serve)

    async def _serve(self, request: web.Request) -> web.Response:
        running = self._running()
        # The scan reads every process's environment: off the kubelets' shared event loop.
        page = await asyncio.to_thread(self.page, running)
        return web.Response(body=page, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def page(self, running: list[RunningContainer]) -> bytes:
        node_mark, pod_mark, container_mark = self._scan.marks
        # By pod uid too: another cluster on the machine may have a node of the same name.
        keys = {f"{c.uid}/{c.container}" for c in running}

        def key_of(marks: Mapping[str, str]) -> str | None:
            key = f"{marks[pod_mark]}/{marks[container_mark]}"
            return key if marks[node_mark] == self._node and key in keys else None

        usage = usage_by_key(self._scan.processes(), key_of)
        node_cpu = self._node_cpu.update({key: u.cpu_seconds for key, u in usage.items()})
        samples = [
            ContainerSample(
                c.namespace, c.pod, c.container, c.start_time, usage.get(f"{c.uid}/{c.container}", Usage())
            )
            for c in running
        ]
        return exposition(node_cpu, samples, time.time())
