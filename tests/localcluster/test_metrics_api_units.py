"""The kubelet's resource metrics and the Metrics API's arithmetic, on real processes: what a
container used is found by its marks, written as a kubelet writes /metrics/resource, read back
and turned into the usage `kubectl top` shows."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
from rtj_localcluster.metrics_api import (
    NodeScrape,
    Point,
    ScrapeHistory,
    cpu_quantity,
    memory_quantity,
    parse_scrape,
    usage_between,
)
from rtj_localcluster.resource_metrics import (
    ContainerSample,
    MachineScan,
    NodeCpuCounter,
    ResourceEndpoint,
    RunningContainer,
    Usage,
    exposition,
    process_usage,
)

MARKS = ("TEST_RM_NODE", "TEST_RM_POD", "TEST_RM_CONTAINER")
BURN = """import time
x = bytearray(48 * 1024 * 1024)
end = time.process_time() + 0.6
while time.process_time() < end:
    pass
time.sleep(60)"""


@pytest.fixture
def burner() -> Iterator[psutil.Process]:
    """A process marked as container `work` of pod uid `u1` on node `n1`, which uses 0.6 s of CPU and
    holds 48 MiB, then sleeps."""
    env = {**os.environ, MARKS[0]: "n1", MARKS[1]: "u1", MARKS[2]: "work"}
    proc = subprocess.Popen([sys.executable, "-c", BURN], env=env)
    process = psutil.Process(proc.pid)
    deadline = time.monotonic() + 30
    while process_usage(process).cpu_seconds < 0.6 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield process
    proc.kill()
    proc.wait()


def test_a_marked_process_is_counted_for_its_container_and_node_only(burner: psutil.Process) -> None:
    running = [RunningContainer("ns", "pod-a", "u1", "work", 1_700_000_000.0)]
    endpoint = ResourceEndpoint("n1", lambda: running, MachineScan(MARKS, ttl_seconds=0))
    scrape = parse_scrape(endpoint.page(running).decode())
    point = scrape.containers[("ns", "pod-a", "work")]
    assert point.cpu_seconds >= 0.6
    assert point.memory_bytes >= 48 * 1024 * 1024
    assert scrape.node is not None and scrape.node.cpu_seconds >= 0.6

    # The same node name in another cluster (another pod uid), or another node: nothing of it.
    other_uid = [RunningContainer("ns", "pod-b", "u2", "work", 1_700_000_000.0)]
    other = ResourceEndpoint("n1", lambda: other_uid, MachineScan(MARKS, ttl_seconds=0))
    assert parse_scrape(other.page(other_uid).decode()).containers[("ns", "pod-b", "work")].cpu_seconds == 0
    elsewhere = ResourceEndpoint("n2", lambda: running, MachineScan(MARKS, ttl_seconds=0))
    assert parse_scrape(elsewhere.page(running).decode()).containers[("ns", "pod-a", "work")].cpu_seconds == 0


def test_the_page_carries_the_kubelets_series_with_sample_times() -> None:
    sample = ContainerSample("ns", "p", "c", 1_700_000_000.0, Usage(12.5, 3 * 1024 * 1024))
    page = exposition(40.0, [sample], 1_700_000_100.25).decode()
    for series in (
        "node_cpu_usage_seconds_total 40.0 1700000100250",
        "node_memory_working_set_bytes 3.145728e+06 1700000100250",
        'container_cpu_usage_seconds_total{container="c",namespace="ns",pod="p"} 12.5 1700000100250',
        'container_memory_working_set_bytes{container="c",namespace="ns",pod="p"} 3.145728e+06 1700000100250',
        'pod_cpu_usage_seconds_total{namespace="ns",pod="p"} 12.5 1700000100250',
        "resource_scrape_error 0.0",
    ):
        assert series in page
    scrape = parse_scrape(page)
    assert scrape.node == Point(40.0, 3 * 1024 * 1024, 1_700_000_100.25)
    assert scrape.containers == {("ns", "p", "c"): Point(12.5, 3 * 1024 * 1024, 1_700_000_100.25)}


def test_a_nodes_cpu_counter_keeps_what_ended_containers_used_and_never_goes_back() -> None:
    counter = NodeCpuCounter()
    assert counter.update({"a": 2.0, "b": 1.0}) == 3.0
    assert counter.update({"a": 5.0}) == 6.0  # b ended: its second stays counted
    assert counter.update({"a": 1.0}) == 6.0  # a restarted with a new counter
    assert counter.update({"a": 1.5, "c": 0.5}) == 7.0


def test_usage_is_the_counters_rate_over_the_window_and_none_when_it_went_back() -> None:
    usage = usage_between(Point(10.0, 100.0, 1000.0), Point(15.0, 300.0, 1010.0))
    assert usage is not None
    assert (usage.cpu_cores, usage.memory_bytes, usage.window_seconds) == (0.5, 300.0, 10.0)
    assert usage_between(Point(10.0, 0, 1000.0), Point(2.0, 0, 1010.0)) is None
    assert usage_between(Point(1.0, 0, 1000.0), Point(2.0, 0, 1000.0)) is None
    assert cpu_quantity(0.5) == "500000000n"
    assert memory_quantity(3 * 1024 * 1024 + 100) == "3072Ki"


def test_the_store_serves_usage_from_a_nodes_second_scrape_until_the_node_is_forgotten() -> None:
    history = ScrapeHistory()

    def scrape(cpu: float, ts: float) -> NodeScrape:
        return NodeScrape(Point(cpu, 10.0, ts), {("ns", "p", "c"): Point(cpu, 10.0, ts)})

    history.record("n1", scrape(1.0, 100.0))
    assert history.node_usage("n1") is None and history.pod_usage() == {}
    history.record("n1", scrape(3.0, 110.0))
    node = history.node_usage("n1")
    assert node is not None and node.cpu_cores == pytest.approx(0.2)
    [(container, usage)] = history.pod_usage()[("ns", "p")]
    assert container == "c" and usage.cpu_cores == pytest.approx(0.2)
    history.forget("n1")
    assert history.node_usage("n1") is None and history.pod_usage() == {}
