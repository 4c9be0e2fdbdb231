"""``LocalCluster``: the embedded cluster put together, and the fault-injection API.

Starts the real control plane (``controlplane``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), then in one background thread an asyncio loop running what Kubernetes does not ship
for this use: shared informers (``client``), one process kubelet per simulated node (``kubelet``),
the volume provisioner (``volumes``) and the DNS hosts-file writer (``dns``). Each kubelet talks to
the API server with its own node identity (``system:node:<name>``), the rest as the cluster's admin.
``stop()`` kills every process the kubelets started (found by the cluster's mark in their
environment, even those a launcher moved to a new session) and stops the control plane.

Used by the pytest fixtures (``testing``), the CLI daemon (``cli``) and the demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .client import ApiError, Informer, KubeClient, KubeConfig, path_for
from .controlplane import ControlPlane, ControlPlaneSettings, stop_marked_processes
from .dns import HostsFileWriter
from .kubelet import MARK_POD, Kubelet, KubeletConfig, signal_marked
from .marks import signal_matching
from .metrics_api import SERVING_DNS_NAME, MetricsApiServer, serve_metrics_api
from .nodes import PROFILES, Degradation, node_object
from .podnet import IpAllocator, library
from .volumes import Provisioner, default_storage_class

log = logging.getLogger(__name__)

T = TypeVar("T")
MARK_CLUSTER = "RTJ_LOCAL_CLUSTER_ID"
INFORMED = (
    "pods",
    "nodes",
    "services",
    "persistentvolumeclaims",
    "persistentvolumes",
    "storageclasses",
)
IMAGE_ENTRYPOINTS: dict[str, list[str]] = {
    # The project's images, as their Dockerfiles' ENTRYPOINTs: run from the host's environment.
    "rtj-operator": ["rtj-operator"],
    "rtj-trainer": ["rtj-launch"],
}
DEFAULT_TOLERATION_SECONDS = 300
"""What DefaultTolerationSeconds admission gives pods without their own not-ready/unreachable
tolerations (Kubernetes' default)."""


TAINT_NOT_READY = "node.kubernetes.io/not-ready"


def node_schedulable(node: dict[str, Any] | None) -> bool:
    """Ready, and no longer tainted not-ready by admission."""
    if node is None:
        return False
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    tainted = any(t.get("key") == TAINT_NOT_READY for t in node.get("spec", {}).get("taints") or [])
    return ready and not tainted


def kill_cluster_processes(cluster_id: str) -> int:
    """SIGKILL every pod process a cluster started (found by its mark); returns how many."""
    if not cluster_id:
        return 0
    return signal_matching(
        signal.SIGKILL, lambda env: env.get(MARK_CLUSTER) == cluster_id and bool(env.get(MARK_POD))
    )


@dataclass
class LocalClusterSettings:
    """How the embedded cluster is built. Times are in seconds."""

    state_dir: Path
    """Where the API server's data, the kubeconfig, pod directories, logs and volumes live."""
    nodes: int = 2
    """Simulated nodes created at start, named ``<node_name_prefix>-<i>``."""
    profile: str = "p5.48xlarge"
    """Node profile of those nodes: a key of ``nodes.PROFILES`` (``p5.48xlarge`` or ``cpu``)."""
    node_name_prefix: str = "node"
    gpu_taint: bool = False
    """Whether the nodes carry ``nvidia.com/gpu=present:NoSchedule`` (as EKS GPU node groups often do)."""
    zones: tuple[str, ...] = ("local-1a",)
    """``topology.kubernetes.io/zone`` values, given to the nodes round-robin."""
    heartbeat_interval_seconds: float = 1.0
    """How often each kubelet renews its Lease (a real kubelet: 10 s)."""
    node_status_interval_seconds: float = 10.0
    """How often each kubelet re-posts its Node status when nothing changed."""
    node_monitor_grace_seconds: float = 40.0
    """Lease age after which a node is marked Ready=Unknown (Kubernetes' node-monitor-grace-period:
    40 s, 50 s from 1.32). Tests and the demo use 3-5 s."""
    node_monitor_period_seconds: float = 1.0
    """How often the node lifecycle controller checks nodes (Kubernetes: 5 s)."""
    default_toleration_seconds: int = DEFAULT_TOLERATION_SECONDS
    """DefaultTolerationSeconds for pods without their own not-ready/unreachable tolerations (300)."""
    restart_backoff_seconds: float = 1.0
    """First delay before restarting a failed container; doubles per restart."""
    max_restart_backoff_seconds: float = 10.0
    """Cap of that delay (Kubernetes: 300 s; kept short so local rehearsals move on)."""
    api_port: int = 0
    """The API server's port on 127.0.0.1 (0: a free port, kept with the state for later starts)."""
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)
    """Put first on every container's PATH: the environment whose programs the pods run."""
    start_timeout_seconds: float = 180.0
    """How long ``start()`` waits for the control plane and every node to be Ready."""
    audit_log: bool = False
    """Run the API server with an audit log (``control_plane.audit_log_path``), for RBAC tests."""


class LocalCluster:
    """The embedded cluster; a context manager. Fault methods are safe to call from any thread."""

    def __init__(self, settings: LocalClusterSettings) -> None:
        if settings.profile not in PROFILES:
            raise ValueError(f"unknown node profile {settings.profile!r}; known: {', '.join(PROFILES)}")
        self.settings = settings
        self.state_dir = Path(settings.state_dir).resolve()
        self.cluster_id = uuid.uuid4().hex
        self.control_plane: ControlPlane | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._kubelets: dict[str, Kubelet] = {}
        self._informers: dict[str, Informer] = {}
        self._client: KubeClient | None = None
        self._ips = IpAllocator()
        self._node_count = 0
        self.start_seconds: float | None = None

    # -- properties ----------------------------------------------------------------------------

    @property
    def kubeconfig_path(self) -> Path:
        """The admin's kubeconfig (kubectl, Helm, the tests)."""
        return self._control_plane.kubeconfig_path

    @property
    def url(self) -> str:
        return self._control_plane.url

    @property
    def _control_plane(self) -> ControlPlane:
        if self.control_plane is None:
            raise RuntimeError("the local cluster is not running")
        return self.control_plane

    @property
    def hosts_file(self) -> Path:
        return self.state_dir / "hosts"

    @property
    def node_names(self) -> list[str]:
        return sorted(self._kubelets)

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory of a running pod (its logs, volumes), if a kubelet runs it."""
        for kubelet in self._kubelets.values():
            worker = kubelet.find_worker(namespace, name)
            if worker is not None:
                return worker.dir
        return None

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        settings = self.settings
        self.control_plane = ControlPlane(
            ControlPlaneSettings(
                state_dir=self.state_dir,
                node_monitor_grace_seconds=settings.node_monitor_grace_seconds,
                node_monitor_period_seconds=settings.node_monitor_period_seconds,
                default_toleration_seconds=settings.default_toleration_seconds,
                api_port=settings.api_port,
                start_timeout_seconds=settings.start_timeout_seconds,
                cluster_id=self.cluster_id,
                audit_log=settings.audit_log,
            )
        )
        self.control_plane.start()
        podnet = library()  # built here once, not on the kubelets' event loop
        if podnet.path is None:
            log.warning("pods share the machine's ports (no pod network library: %s)", podnet.reason)
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="rtj-local-cluster", daemon=True)
        self._thread.start()
        try:
            self._call(self._astart(), timeout=self.settings.start_timeout_seconds)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        log.info("local cluster up in %.2fs: %s", self.start_seconds, self.kubeconfig_path)

    def stop(self) -> None:
        """Kill every process the kubelets started, stop the controllers and the API server."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._astop(), timeout=30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()
        self._loop = self._thread = None
        self._sweep_processes()
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        stop_marked_processes(self.cluster_id)
        self._ips.release()

    def _sweep_processes(self) -> None:
        kill_cluster_processes(self.cluster_id)

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the local cluster is not running")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # do not leave it running on the loop that stop() is about to close
            raise

    async def _astart(self) -> None:
        config = KubeConfig(self.kubeconfig_path)
        self._client = KubeClient(config, user_agent="rtj-local-controllers")
        for resource in INFORMED:
            informer = Informer(self._client, resource)
            self._informers[resource] = informer
            self._spawn(informer.run(), f"informer {resource}")
        for informer in self._informers.values():
            await informer.synced()
        with contextlib.suppress(ApiError):
            await self._client.create(path_for("storageclasses"), default_storage_class())
        informers = self._informers
        self._spawn(HostsFileWriter(self.hosts_file, informers["pods"], informers["services"]).run(), "dns")
        self._spawn(
            Provisioner(
                self._client,
                informers["persistentvolumeclaims"],
                informers["persistentvolumes"],
                informers["storageclasses"],
                self.state_dir,
            ).run(),
            "volume-provisioner",
        )
        for _ in range(self.settings.nodes):
            await self._add_node(None, self.settings.profile, self.settings.gpu_taint)
        metrics = MetricsApiServer(
            self._client,
            informers["nodes"],
            informers["pods"],
            self._control_plane.pki_serving("metrics-server", dns_names=(SERVING_DNS_NAME,)),
            self._control_plane.ca_path,
        )
        self._spawn(serve_metrics_api(metrics), "metrics-api")
        await self._wait_nodes_ready(list(self._kubelets))
        await self._wait_default_service_account()

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.append(task)

    async def _astop(self) -> None:
        for kubelet in self._kubelets.values():
            kubelet.kill()
        await asyncio.gather(*(kubelet.reap() for kubelet in self._kubelets.values()))
        await asyncio.gather(*(kubelet.close() for kubelet in self._kubelets.values()))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._client is not None:
            await self._client.close()

    async def _wait_nodes_ready(self, names: list[str]) -> None:
        """Until every node is Ready and schedulable: a new Node carries the not-ready NoSchedule
        taint (TaintNodesByCondition admission) until the node lifecycle controller has seen it
        Ready, and a pod that does not tolerate it waits for that."""
        nodes = self._informers["nodes"]
        changed = asyncio.Event()
        nodes.subscribe(changed.set)
        try:
            while not all(node_schedulable(nodes.get(name)) for name in names):
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=1)
        finally:
            nodes.unsubscribe(changed.set)

    async def _wait_default_service_account(self) -> None:
        """ServiceAccount admission refuses pods until the controller manager made ``default``."""
        assert self._client is not None
        while True:
            try:
                await self._client.get(path_for("serviceaccounts", "default", "default"))
                return
            except ApiError as error:
                if error.status != 404:
                    raise
            await asyncio.sleep(0.1)

    def _node_client(self, name: str) -> KubeClient:
        """A client with the node's own identity: the Node authorizer and NodeRestriction judge it."""
        kubeconfig = self._control_plane.kubeconfig_for(
            f"node-{name}", f"system:node:{name}", ("system:nodes",)
        )
        return KubeClient(KubeConfig(kubeconfig), user_agent=f"rtj-local-kubelet/{name}")

    async def _add_node(self, name: str | None, profile_name: str, gpu_taint: bool) -> str:
        assert self._client is not None
        if name is None:
            while f"{self.settings.node_name_prefix}-{self._node_count}" in self._kubelets:
                self._node_count += 1
            name = f"{self.settings.node_name_prefix}-{self._node_count}"
            self._node_count += 1
        if name in self._kubelets and not self._kubelets[name].dead:
            raise ValueError(f"node {name!r} already exists")
        if name in self._kubelets:  # a killed node comes back (a reboot): its old agent is gone
            await self._kubelets.pop(name).close()
        profile = PROFILES[profile_name]
        zones = self.settings.zones
        zone = zones[len(self._kubelets) % len(zones)]
        config = KubeletConfig(
            state_dir=self.state_dir,
            api_host="127.0.0.1",
            api_port=self._control_plane.ports["apiserver"],
            hosts_file=self.hosts_file,
            bin_dir=self.settings.bin_dir,
            heartbeat_interval_seconds=self.settings.heartbeat_interval_seconds,
            node_status_interval_seconds=self.settings.node_status_interval_seconds,
            restart_backoff_seconds=self.settings.restart_backoff_seconds,
            max_restart_backoff_seconds=self.settings.max_restart_backoff_seconds,
            image_entrypoints=IMAGE_ENTRYPOINTS,
            extra_env={MARK_CLUSTER: self.cluster_id},
        )
        kubelet = Kubelet(
            name,
            profile,
            node_object(name, profile, zone=zone, gpu_taint=gpu_taint),
            client=self._node_client(name),
            pods=self._informers["pods"],
            nodes=self._informers["nodes"],
            config=config,
            ips=self._ips,
            serving=self._control_plane.pki_serving("kubelet-serving"),
        )
        await kubelet.register()
        kubelet.start()
        self._kubelets[name] = kubelet
        return name

    # -- faults (callable from any thread) -----------------------------------------------------

    def _kubelet(self, name: str) -> Kubelet:
        if name not in self._kubelets:
            raise KeyError(f"no node {name!r}; nodes: {', '.join(self.node_names)}")
        return self._kubelets[name]

    def add_node(
        self, name: str | None = None, *, profile: str | None = None, gpu_taint: bool | None = None
    ) -> str:
        """Register a new node (Ready once its kubelet posts status); returns its name."""
        profile_name = profile or self.settings.profile
        if profile_name not in PROFILES:
            raise ValueError(f"unknown node profile {profile_name!r}")
        taint = self.settings.gpu_taint if gpu_taint is None else gpu_taint

        async def add() -> str:
            added = await self._add_node(name, profile_name, taint)
            await self._wait_nodes_ready([added])
            return added

        return self._call(add())

    def kill_node(self, name: str) -> None:
        """The machine dies: its pods' processes are SIGKILLed, heartbeats and status updates stop.
        The API objects stay as they are; the lifecycle controller notices after the grace period."""
        kubelet = self._kubelet(name)

        async def kill() -> None:
            kubelet.kill()
            await kubelet.swept()  # the machine is dead once its last process is

        self._call(kill())

    def partition_node(self, name: str) -> None:
        """The node loses the API server: processes keep running, nothing is reported."""
        kubelet = self._kubelet(name)

        async def partition() -> None:
            kubelet.partition()

        self._call(partition())

    def heal_node(self, name: str) -> None:
        """End a partition or NotReady: heartbeats resume, the node turns Ready again, status
        catches up."""
        kubelet = self._kubelet(name)

        async def heal() -> None:
            kubelet.heal()

        self._call(heal())

    def make_node_not_ready(self, name: str, message: str = "container runtime is down") -> None:
        """The kubelet keeps its lease but reports Ready=False (reason KubeletNotReady): the
        lifecycle controller adds the not-ready taints and evicts by toleration. Processes keep
        running. ``heal_node`` ends it."""
        kubelet = self._kubelet(name)

        async def not_ready() -> None:
            kubelet.set_not_ready(message)

        self._call(not_ready())

    def degrade_node(
        self,
        name: str,
        *,
        conditions: Sequence[Mapping[str, str]] = (),
        allocatable: Mapping[str, str] | None = None,
    ) -> None:
        """The node stays Ready but its kubelet reports extra ``conditions`` (e.g. ``{"type":
        "AcceleratedHardwareReady", "status": "False"}``, as a node health agent sets) and a lower
        ``allocatable`` (as the GPU device plugin reports for a GPU off the bus), until ``heal_node``."""
        kubelet = self._kubelet(name)
        degradation = Degradation(tuple(dict(c) for c in conditions), dict(allocatable or {}))

        async def degrade() -> None:
            kubelet.degrade(degradation)

        self._call(degrade())

    def delete_node(self, name: str) -> None:
        """Kill the node and delete its Node object (pod GC then removes its pods)."""
        kubelet = self._kubelet(name)

        async def delete() -> None:
            kubelet.kill()
            assert self._client is not None
            with contextlib.suppress(ApiError):
                await self._client.delete(path_for("nodes", name=name))
            self._kubelets.pop(name, None)
            await kubelet.reap()
            await kubelet.close()

        self._call(delete())

    def kill_container(self, namespace: str, pod: str, container: str | None = None) -> int:
        """SIGKILL a container's processes (all containers of the pod when None); the kubelet then
        reports the exit and applies the restart policy. Returns how many processes were signalled."""
        for kubelet in self._kubelets.values():
            worker = kubelet.find_worker(namespace, pod)
            if worker is not None:
                return signal_marked(worker.uid, container, signal.SIGKILL)
        raise KeyError(f"no running pod {namespace}/{pod}")

    def node_ready_status(self, name: str) -> str | None:
        """The Ready condition's status as the cluster's informer sees it (None: no such node)."""
        node = self._informers["nodes"].get(name)
        if node is None:
            return None
        for item in node.get("status", {}).get("conditions") or []:
            if item.get("type") == "Ready":
                return str(item.get("status"))
        return None
