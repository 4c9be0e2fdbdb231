"""Hollow nodes as the API server sees them: each Node registered with its status and its Lease in
``kube-node-lease``, and the Leases renewed by one loop, spread evenly over the renewal interval (as
many kubelets' renewals are), until a node is lost. Everything that follows from a stale Lease is
Kubernetes' own: the node lifecycle controller marks the node Ready=Unknown and taints it."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass

from ..client import ApiError, KubeClient, now_micro, path_for
from ..nodes import NODE_LEASE_NAMESPACE, NodeProfile, lease_object, node_object, node_status

log = logging.getLogger(__name__)

HOST_IP = "127.0.0.1"
NO_KUBELET_PORT = 10250  # advertised only: a hollow node serves no logs, exec or port-forward


@dataclass
class HollowNode:
    name: str
    zone: str
    profile: NodeProfile
    due: float = 0.0  # monotonic time of its next renewal
    lost: bool = False
    stale_status: bool = False  # Ready to be posted again (the lifecycle controller set it Unknown)


async def bounded(calls: Iterable[Awaitable[None]], limit: int) -> None:
    """Await every call, at most `limit` at once."""
    slots = asyncio.Semaphore(limit)

    async def one(call: Awaitable[None]) -> None:
        try:
            async with slots:
                await call
        finally:
            if inspect.iscoroutine(call):
                call.close()  # cancelled before its turn: it never started

    await asyncio.gather(*(one(call) for call in calls))


class NodeLeases:
    """The hollow nodes' registrations and heartbeats, through one client."""

    def __init__(self, client: KubeClient, *, interval_seconds: float, concurrency: int) -> None:
        self.client = client
        self.interval_seconds = interval_seconds
        self.concurrency = concurrency
        self.nodes: dict[str, HollowNode] = {}
        self.renewals = 0

    def live(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and not node.lost

    async def register(
        self, names: list[str], zones: list[str], profile: NodeProfile, gpu_taint: bool
    ) -> None:
        """Create each Node, post its status and create its Lease (a node registered before, by a
        restarted agent, is taken over as it is)."""
        await bounded(
            (self._register(name, zone, profile, gpu_taint) for name, zone in zip(names, zones, strict=True)),
            self.concurrency,
        )

    async def _register(self, name: str, zone: str, profile: NodeProfile, gpu_taint: bool) -> None:
        try:
            created = await self.client.create(
                path_for("nodes"), node_object(name, profile, zone=zone, gpu_taint=gpu_taint)
            )
        except ApiError as error:
            if error.status != 409:
                raise
            created = await self.client.get(path_for("nodes", name=name))
        await self._post_status(name, profile)
        try:
            await self.client.create(
                path_for("leases", NODE_LEASE_NAMESPACE), lease_object(name, created["metadata"]["uid"])
            )
        except ApiError as error:
            if error.status != 409:
                raise
        offset = self.interval_seconds * (len(self.nodes) % 97) / 97  # spread the renewals
        self.nodes[name] = HollowNode(name, zone, profile, due=time.monotonic() + offset)

    async def _post_status(self, name: str, profile: NodeProfile) -> None:
        status = node_status(profile, host_ip=HOST_IP, kubelet_port=NO_KUBELET_PORT)
        await self.client.patch(path_for("nodes", name=name, subresource="status"), {"status": status})

    def lose(self, names: Iterable[str]) -> None:
        """The nodes stop renewing (a machine gone): the lifecycle controller then judges them."""
        for name in names:
            self.nodes[name].lost = True

    def recover(self, names: Iterable[str]) -> None:
        """The nodes are back: their next renewal is now, and it posts their status (Ready again,
        as a kubelet does when it finds its Ready condition not True)."""
        for name in names:
            node = self.nodes[name]
            node.lost, node.stale_status, node.due = False, True, time.monotonic()

    async def run(self) -> None:
        """Renew each live node's Lease once per interval, forever."""
        tick = min(0.25, self.interval_seconds / 4)
        while True:
            now = time.monotonic()
            due = [node for node in self.nodes.values() if not node.lost and node.due <= now]
            for node in due:
                node.due = now + self.interval_seconds
            if due:
                await bounded((self._renew(node.name) for node in due), self.concurrency)
            await asyncio.sleep(tick)

    async def _renew(self, name: str) -> None:
        try:
            await self.client.patch(
                path_for("leases", NODE_LEASE_NAMESPACE, name), {"spec": {"renewTime": now_micro()}}
            )
            self.renewals += 1
            node = self.nodes[name]
            if node.stale_status:
                await self._post_status(name, node.profile)
                node.stale_status = False
        except asyncio.CancelledError:
            raise
        except Exception as error:  # one failed renewal is retried next interval
            log.debug("hollow node %s: lease renewal failed: %s", name, error)
