"""Hollow nodes: many Nodes that one lightweight agent keeps, as kwok does, for measuring the
operator and the control plane at scale on one small machine (``rtj bench scale``).

The real API server, scheduler and controller manager judge them as any other nodes: the agent
registers each Node with its status and Lease and renews the Leases (``leases``); the pods bound to
them go through their phases without processes, and each worker's stand-in trainer serves the same
progress endpoint a trainer does, its step advancing at a set rate (``pods``, ``standin``). A lost
node stops renewing its Lease and its stand-ins stop answering; the node lifecycle controller and the
operator do the rest. Hollow and process nodes can be mixed in one cluster.

Not simulated: containers, images, volumes' contents, logs, exec, the GPUs and the network between
ranks (a world re-forms the moment its last member runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from ..client import Informer, KubeClient, run_level_triggered
from ..nodes import NodeProfile
from ..podnet import IpAllocator
from .leases import NodeLeases
from .pods import HollowPods
from .standin import STEP_SECONDS_ENV, STEPS_ENV

__all__ = ["STEPS_ENV", "STEP_SECONDS_ENV", "HollowNodes", "HollowSettings"]


@dataclass(frozen=True)
class HollowSettings:
    """How the hollow nodes behave. Times are in seconds."""

    lease_interval_seconds: float = 10.0
    """How often each hollow node renews its Lease (a real kubelet: 10 s); keep it well under the
    cluster's node-monitor grace period."""
    step_seconds: float = 1.0
    """How long one stand-in training step takes (a pod's ``RTJ_HOLLOW_STEP_SECONDS`` overrides it)."""
    concurrency: int = 16
    """Requests to the API server in flight at once, per kind of work."""


class HollowNodes:
    """The agent of every hollow node of one cluster; its methods run on the cluster's loop."""

    def __init__(
        self, client: KubeClient, pods: Informer, ips: IpAllocator, settings: HollowSettings
    ) -> None:
        self.settings = settings
        self.leases = NodeLeases(
            client, interval_seconds=settings.lease_interval_seconds, concurrency=settings.concurrency
        )
        self.pods = HollowPods(client, self.leases, ips, settings.step_seconds)
        self._informer = pods
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def names(self) -> list[str]:
        return sorted(self.leases.nodes)

    def zone_of(self, name: str) -> str:
        if name not in self.leases.nodes:
            raise KeyError(f"no hollow node {name!r}")
        return self.leases.nodes[name].zone

    async def add(
        self, names: list[str], zones: list[str], profile: NodeProfile, *, gpu_taint: bool = False
    ) -> None:
        """Register the nodes (the agent starts with the first ones)."""
        await self.leases.register(names, zones, profile, gpu_taint)
        if not self._tasks:
            self._informer.subscribe(self._wake.set)
            self._tasks = [
                asyncio.create_task(self.leases.run(), name="hollow-leases"),
                asyncio.create_task(
                    run_level_triggered(
                        "hollow pods", [self._informer], self._wake, self._sync, period_seconds=1.0
                    ),
                    name="hollow-pods",
                ),
            ]
        self._wake.set()

    async def _sync(self) -> None:
        await self.pods.sync(self._informer.items())

    def lose(self, names: Iterable[str]) -> None:
        """The nodes are gone: no more Lease renewals, and their pods' stand-ins stop."""
        self.leases.lose(names)
        self._wake.set()

    def recover(self, names: Iterable[str]) -> None:
        """The nodes are back (rebooted): renewals again; their old pods stay as they are."""
        self.leases.recover(names)
        self._wake.set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._tasks:
            self._informer.unsubscribe(self._wake.set)
        self._tasks = []
        await self.pods.close()
