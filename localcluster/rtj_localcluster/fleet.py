"""The local cluster's nodes: one process kubelet per simulated node, registered, found, broken and
removed on the cluster's event loop (``LocalCluster``'s fault methods call these from any thread).

Each kubelet talks to the API server with its node's own identity (``system:node:<name>``), which the
Node authorizer and NodeRestriction admission judge as they would a real kubelet's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import ApiError, Informer, KubeClient, KubeConfig, path_for
from .controlplane import ControlPlane
from .hollow import HollowNodes, HollowSettings
from .kubelet import Kubelet, KubeletConfig, PodWorker
from .nodes import PROFILES, NodeProfile, node_object
from .podnet import IpAllocator

TAINT_NOT_READY = "node.kubernetes.io/not-ready"


def node_schedulable(node: dict[str, Any] | None) -> bool:
    """Ready, and no longer tainted not-ready by admission."""
    if node is None:
        return False
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    tainted = any(t.get("key") == TAINT_NOT_READY for t in node.get("spec", {}).get("taints") or [])
    return ready and not tainted


@dataclass(frozen=True)
class NodeNaming:
    """New nodes are ``<prefix>-<i>`` and take the zones round-robin."""

    prefix: str
    zones: tuple[str, ...]


class Fleet:
    """The kubelets of one cluster, by node name; every method but the lookups runs on its loop."""

    def __init__(
        self,
        *,
        naming: NodeNaming,
        kubelet_config: KubeletConfig,
        control_plane: ControlPlane,
        admin: KubeClient,
        informers: dict[str, Informer],
        ips: IpAllocator,
    ) -> None:
        self._naming = naming
        self._config = kubelet_config
        self._control_plane = control_plane
        self._admin = admin
        self._pods = informers["pods"]
        self._nodes = informers["nodes"]
        self._ips = ips
        self._kubelets: dict[str, Kubelet] = {}
        self._count = 0
        self.hollow: HollowNodes | None = None

    @property
    def names(self) -> list[str]:
        return sorted(self._kubelets)

    def kubelet(self, name: str) -> Kubelet:
        if name not in self._kubelets:
            raise KeyError(f"no node {name!r}; nodes: {', '.join(self.names)}")
        return self._kubelets[name]

    def find_worker(self, namespace: str, pod: str) -> PodWorker | None:
        """The worker of a pod some kubelet runs, if one does."""
        for kubelet in self._kubelets.values():
            worker = kubelet.find_worker(namespace, pod)
            if worker is not None:
                return worker
        return None

    def ready_status(self, name: str) -> str | None:
        """The Ready condition's status as the cluster's informer sees it (None: no such node)."""
        node = self._nodes.get(name)
        if node is None:
            return None
        for item in node.get("status", {}).get("conditions") or []:
            if item.get("type") == "Ready":
                return str(item.get("status"))
        return None

    def _next_name(self) -> str:
        while f"{self._naming.prefix}-{self._count}" in self._kubelets:
            self._count += 1
        self._count += 1
        return f"{self._naming.prefix}-{self._count - 1}"

    def _node_client(self, name: str) -> KubeClient:
        kubeconfig = self._control_plane.kubeconfig_for(
            f"node-{name}", f"system:node:{name}", ("system:nodes",)
        )
        return KubeClient(KubeConfig(kubeconfig), user_agent=f"rtj-local-kubelet/{name}")

    async def add(self, name: str | None, profile_name: str, gpu_taint: bool) -> str:
        """Register node `name` (the next free one when None) and start its kubelet; a killed node of
        that name comes back (a reboot: its old agent is gone)."""
        name = name or self._next_name()
        if name in self._kubelets and not self._kubelets[name].dead:
            raise ValueError(f"node {name!r} already exists")
        if name in self._kubelets:
            await self._kubelets.pop(name).close()
        profile = PROFILES[profile_name]
        zone = self._naming.zones[len(self._kubelets) % len(self._naming.zones)]
        kubelet = Kubelet(
            name,
            profile,
            node_object(name, profile, zone=zone, gpu_taint=gpu_taint),
            client=self._node_client(name),
            pods=self._pods,
            nodes=self._nodes,
            config=self._config,
            ips=self._ips,
            serving=self._control_plane.pki_serving("kubelet-serving"),
        )
        await kubelet.reporter.register()
        kubelet.start()
        self._kubelets[name] = kubelet
        return name

    async def add_hollow(
        self,
        names: list[str],
        zones: list[str],
        profile: NodeProfile,
        gpu_taint: bool,
        settings: HollowSettings,
    ) -> list[str]:
        """Register hollow nodes (``hollow``: one agent keeps them all) and wait until they are Ready."""
        taken = set(self._kubelets) & set(names)
        if taken:
            raise ValueError(f"nodes {sorted(taken)} are process nodes")
        if self.hollow is None:
            self.hollow = HollowNodes(self._admin, self._pods, self._ips, settings)
        await self.hollow.add(names, zones, profile, gpu_taint=gpu_taint)
        await self.wait_ready(names)
        return names

    async def wait_ready(self, names: list[str]) -> None:
        """Until every node is Ready and schedulable: a new Node carries the not-ready NoSchedule
        taint (TaintNodesByCondition admission) until the node lifecycle controller has seen it
        Ready, and a pod that does not tolerate it waits for that."""
        changed = asyncio.Event()
        self._nodes.subscribe(changed.set)
        try:
            while not all(node_schedulable(self._nodes.get(name)) for name in names):
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=1)
        finally:
            self._nodes.unsubscribe(changed.set)

    async def kill(self, name: str) -> None:
        kubelet = self.kubelet(name)
        kubelet.kill()
        await kubelet.swept()  # the machine is dead once its last process is

    async def change(self, name: str, how: Callable[[Kubelet], None]) -> None:
        """Apply `how` (partition, heal, not ready, degrade) to node `name`'s kubelet on the loop."""
        how(self.kubelet(name))

    async def delete(self, name: str) -> None:
        """Kill the node and delete its Node object (pod GC then removes its pods)."""
        kubelet = self.kubelet(name)
        kubelet.kill()
        with contextlib.suppress(ApiError):
            await self._admin.delete(path_for("nodes", name=name))
        self._kubelets.pop(name, None)
        await kubelet.reap()
        await kubelet.close()

    async def close(self) -> None:
        """Every kubelet's processes killed and reaped, its agent closed; the hollow nodes' agent closed."""
        if self.hollow is not None:
            await self.hollow.close()
        for kubelet in self._kubelets.values():
            kubelet.kill()
        await asyncio.gather(*(kubelet.reap() for kubelet in self._kubelets.values()))
        await asyncio.gather(*(kubelet.close() for kubelet in self._kubelets.values()))
