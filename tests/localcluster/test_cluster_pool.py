"""The pool behind the ``local_cluster`` fixture: clusters started ahead in threads, each used once."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from rtj_localcluster.cluster_pool import ClusterPool
from rtj_localcluster.testing import wait_for


class FakeCluster:
    """Records its start and stop; a start waits until the test lets it finish."""

    def __init__(self, settings: Mapping[str, Any], events: list[str], gate: threading.Event) -> None:
        self.settings = dict(settings)
        self.events = events
        self.gate = gate
        self.started = False
        self.stopped = threading.Event()

    def start(self) -> None:
        self.events.append(f"start {self.settings['nodes']}")
        assert self.gate.wait(10)
        if self.settings.get("fails"):
            raise RuntimeError("port already in use")
        self.started = True

    def stop(self) -> None:
        self.events.append(f"stop {self.settings['nodes']}")
        self.stopped.set()


@pytest.fixture
def events() -> list[str]:
    return []


@pytest.fixture
def gate() -> threading.Event:
    return threading.Event()


@pytest.fixture
def made() -> list[FakeCluster]:
    return []


@pytest.fixture
def pool(events: list[str], gate: threading.Event, made: list[FakeCluster]) -> ClusterPool[FakeCluster]:
    def new_cluster(settings: Mapping[str, Any]) -> FakeCluster:
        made.append(FakeCluster(settings, events, gate))
        return made[-1]

    return ClusterPool(new_cluster)


def test_a_wanted_cluster_starts_in_the_background_and_is_taken_started(
    pool: ClusterPool[FakeCluster], gate: threading.Event, made: list[FakeCluster]
) -> None:
    pool.want([{"nodes": 2}])
    assert len(made) == 1 and not made[0].started  # want() does not wait for the start
    gate.set()
    cluster = pool.take({"nodes": 2})
    assert cluster is made[0] and cluster.started
    cluster_again = pool.take({"nodes": 2})  # a cluster serves one test: the next one is new
    assert cluster_again is not cluster and len(made) == 2 and cluster_again.started
    pool.close()


def test_clusters_are_matched_by_settings_and_unwanted_ones_are_stopped(
    pool: ClusterPool[FakeCluster], gate: threading.Event, made: list[FakeCluster]
) -> None:
    gate.set()
    pool.want([{"nodes": 2}, {"nodes": 3}, {"nodes": 2}])
    pool.want([{"nodes": 3}, {"nodes": 2}])  # the first test went (deselected): one 2 is left over
    assert len(made) == 3
    three = pool.take({"nodes": 3})
    assert three.settings == {"nodes": 3} and three.started
    twos = [c for c in made if c.settings == {"nodes": 2}]
    wait_for(
        lambda: any(c.stopped.is_set() for c in twos), timeout=10, message="the left-over cluster stopped"
    )
    assert sum(c.stopped.is_set() for c in twos) == 1
    two = pool.take({"nodes": 2})
    assert not two.stopped.is_set() and two in made
    pool.close()
    assert not three.stopped.is_set() and not two.stopped.is_set()  # in use: the fixture gives them back


def test_a_used_cluster_stops_in_the_background_and_close_waits_for_it(
    pool: ClusterPool[FakeCluster], gate: threading.Event, events: list[str]
) -> None:
    gate.set()
    cluster = pool.take({"nodes": 1})
    pool.want([{"nodes": 4}])
    pool.give_back(cluster)
    pool.close()  # the warm 4 was never taken: stopped too
    assert cluster.stopped.is_set()
    assert sorted(events) == ["start 1", "start 4", "stop 1", "stop 4"]


def test_a_warm_start_that_failed_fails_the_test_that_takes_it(
    pool: ClusterPool[FakeCluster], gate: threading.Event
) -> None:
    pool.want([{"nodes": 2, "fails": True}])
    gate.set()
    with pytest.raises(RuntimeError, match="port already in use"):
        pool.take({"nodes": 2, "fails": True})
    pool.close()
