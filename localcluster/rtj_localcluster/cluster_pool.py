"""Fresh local clusters for the tests that break nodes, started before they are needed.

A fault test gets a cluster of its own (the ``local_cluster`` fixture), and starting one takes about
5 s on 2 cores (etcd, the API server's start-up hooks, the controller manager, then the nodes' not-ready
taint lifted). The pool starts the clusters of the next tests in threads while
the tests before them run, and stops a used cluster in a thread while the next test runs, so a suite
of 36 fault tests no longer waits 36 times. A cluster is only ever used by one test: nothing of a broken
node carries over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

SettingsKey = tuple[tuple[str, Hashable], ...]


class Cluster(Protocol):
    """What the pool needs of a cluster (``LocalCluster`` in the tests)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


C = TypeVar("C", bound=Cluster)


def settings_key(settings: Mapping[str, Any]) -> SettingsKey:
    """What two requests for a cluster must share to be served by the same warm cluster."""
    return tuple(sorted(settings.items()))


class _Warming(Generic[C]):
    """One cluster starting in a thread; ``result()`` waits for it and raises what its start raised."""

    def __init__(self, cluster: C) -> None:
        self._cluster = cluster
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="rtj-cluster-warm-up", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self._cluster.start()
        except BaseException as error:  # handed to the test that takes the cluster
            self._error = error

    def result(self) -> C:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._cluster


class ClusterPool(Generic[C]):
    """Clusters warming for the tests about to run, and used ones stopping, each in a thread.
    `new_cluster` makes a cluster (not started) of the given settings."""

    def __init__(self, new_cluster: Callable[[Mapping[str, Any]], C]) -> None:
        self._new_cluster = new_cluster
        self._warm: list[tuple[SettingsKey, _Warming[C]]] = []
        self._stopping: list[threading.Thread] = []
        self._lock = threading.Lock()

    def want(self, upcoming: Sequence[Mapping[str, Any]]) -> None:
        """Have a cluster warming for each of `upcoming` (the settings of the next tests that take
        one, in order); a warm cluster no upcoming test wants is stopped (its test was deselected,
        or failed before taking it)."""
        with self._lock:
            spare = self._warm
            kept: list[tuple[SettingsKey, _Warming[C]]] = []
            for settings in upcoming:
                key = settings_key(settings)
                warming = _pop(spare, key) or _Warming(self._new_cluster(settings))
                kept.append((key, warming))
            self._warm = kept
        for _, warming in spare:
            self._stop_later(warming)

    def take(self, settings: Mapping[str, Any]) -> C:
        """A started cluster with `settings`: a warm one if there is one, else one started now."""
        with self._lock:
            warming = _pop(self._warm, settings_key(settings))
        if warming is not None:
            return warming.result()
        cluster = self._new_cluster(settings)
        cluster.start()
        return cluster

    def give_back(self, cluster: C) -> None:
        """Stop a used cluster in a thread: the next test starts meanwhile."""
        self._stop_in_thread(cluster.stop)

    def close(self) -> None:
        """Stop what is still warm and wait until every cluster has stopped."""
        with self._lock:
            unused, self._warm = self._warm, []
        for _, warming in unused:
            self._stop_later(warming)
        for thread in self._stopping:
            thread.join()
        self._stopping.clear()

    def _stop_later(self, warming: _Warming[C]) -> None:
        def stop() -> None:
            try:
                cluster = warming.result()
            except BaseException as error:  # start() stopped what it had started before raising
                log.warning("an unused warm cluster did not start: %s", error)
                return
            cluster.stop()

        self._stop_in_thread(stop)

    def _stop_in_thread(self, stop: Callable[[], None]) -> None:
        thread = threading.Thread(target=stop, name="rtj-cluster-stop", daemon=True)
        thread.start()
        self._stopping = [t for t in self._stopping if t.is_alive()] + [thread]


def _pop(entries: list[tuple[SettingsKey, _Warming[C]]], key: SettingsKey) -> _Warming[C] | None:
    """Remove and return the first of `entries` warming with settings `key` (None: there is none)."""
    for index, (entry_key, warming) in enumerate(entries):
        if entry_key == key:
            del entries[index]
            return warming
    return None
