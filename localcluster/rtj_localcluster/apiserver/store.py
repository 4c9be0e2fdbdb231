"""In-memory object storage with a global resourceVersion, a bounded event history and watchers.

Everything runs on the API server's single event loop, so no locks are needed: ``core`` mutates
through :meth:`Store.put` / :meth:`Store.remove`, which bump the global resourceVersion (like etcd's
revision), append to the history window and fan the event out to matching watchers. A watch that
resumes from a resourceVersion older than the window gets 410 Gone, as from a compacted etcd.
Stored objects are never mutated in place (writers always store a new dict), so readers may
serialize them without copying.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]  # (group, plural) as in ResourceType.storage_key
ObjectName = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True, slots=True)
class Event:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass(eq=False)
class Watcher:
    """One watch stream's subscription: the resource, a namespace (or all) and a filter."""

    key: Key
    namespace: str | None
    predicate: Callable[[dict[str, Any]], bool]
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = field(default_factory=asyncio.Queue)
    closed: bool = False

    def offer(self, event: Event) -> None:
        """Queue the event as this watcher sees it: an object that stops matching the filter is
        DELETED for it, one that starts matching is ADDED (as the real watch cache does)."""
        if self.namespace is not None and event.obj.get("metadata", {}).get("namespace") != self.namespace:
            return
        now = self.predicate(event.obj)
        if event.type == "MODIFIED" and event.old is not None:
            before = self.predicate(event.old)
            if now and not before:
                self.queue.put_nowait(("ADDED", event.obj))
            elif before and not now:
                self.queue.put_nowait(("DELETED", event.obj))
            elif now:
                self.queue.put_nowait(("MODIFIED", event.obj))
        elif now:
            self.queue.put_nowait((event.type, event.obj))


class Store:
    def __init__(self, history_size: int = 10_000) -> None:
        self.rv = 1
        self._objects: dict[Key, dict[ObjectName, dict[str, Any]]] = {}
        self._history: deque[Event] = deque()
        self._history_size = history_size
        # Events with rv <= compacted_rv are gone from the window.
        self.compacted_rv = 1
        self._watchers: dict[Key, set[Watcher]] = {}

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def get(self, key: Key, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get(key, {}).get((namespace, name))

    def items(self, key: Key, namespace: str | None = None) -> Iterator[dict[str, Any]]:
        bucket = self._objects.get(key, {})
        if namespace is None:
            yield from bucket.values()
        else:
            for (ns, _), obj in bucket.items():
                if ns == namespace:
                    yield obj

    def resource_keys(self) -> list[Key]:
        return list(self._objects)

    def count(self) -> int:
        return sum(len(b) for b in self._objects.values())

    def put(
        self, key: Key, obj: dict[str, Any], event_type: str, old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Store ``obj`` with a new resourceVersion (set here) and publish the event."""
        rv = self.next_rv()
        meta = dict(obj["metadata"])
        meta["resourceVersion"] = str(rv)
        stored = {**obj, "metadata": meta}
        self._objects.setdefault(key, {})[(meta.get("namespace", ""), meta["name"])] = stored
        self._publish(Event(rv, key, event_type, stored, old))
        return stored

    def remove(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        """Delete ``obj``; the DELETED event carries a new resourceVersion as on a real server."""
        meta = obj["metadata"]
        self._objects.get(key, {}).pop((meta.get("namespace", ""), meta["name"]), None)
        rv = self.next_rv()
        gone = {**obj, "metadata": {**meta, "resourceVersion": str(rv)}}
        self._publish(Event(rv, key, "DELETED", gone, None))
        return gone

    def _publish(self, event: Event) -> None:
        self._history.append(event)
        while len(self._history) > self._history_size:
            self.compacted_rv = self._history.popleft().rv
        for watcher in self._watchers.get(event.key, ()):
            watcher.offer(event)

    def compact(self) -> None:
        """Drop the whole history window (as an etcd compaction would); used by tests of 410 Gone."""
        if self._history:
            self.compacted_rv = self._history[-1].rv
        self._history.clear()
        self.compacted_rv = max(self.compacted_rv, self.rv)

    def subscribe(self, watcher: Watcher, since: int | None) -> bool:
        """Register ``watcher``; replay the events after ``since`` first. False: ``since`` is too old."""
        if since is not None:
            if since < self.compacted_rv:
                return False
            for event in self._history:
                if event.rv > since and event.key == watcher.key:
                    watcher.offer(event)
        self._watchers.setdefault(watcher.key, set()).add(watcher)
        return True

    def close_watchers(self, key: Key) -> None:
        """End every watch of ``key`` (its resource type went away)."""
        for watcher in self._watchers.pop(key, set()):
            watcher.closed = True
            watcher.queue.put_nowait(("CLOSED", {}))

    def unsubscribe(self, watcher: Watcher) -> None:
        self._watchers.get(watcher.key, set()).discard(watcher)

    def watcher_count(self) -> int:
        return sum(len(w) for w in self._watchers.values())
