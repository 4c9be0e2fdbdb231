"""``LocalCluster``: the embedded cluster put together, and the fault-injection API.

Starts the real control plane (``controlplane``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler), then in one background thread (``loop_thread``) an asyncio loop running what
Kubernetes does not ship for this use: shared informers (``client``), the nodes (``fleet``: one
process kubelet per simulated node, ``kubelet``), the volume provisioner (``volumes``), the DNS
hosts-file writer (``dns``) and the metrics API (``metrics_api``). Each kubelet talks to the API
server with its own node identity (``system:node:<name>``), the rest as the cluster's admin.
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
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .client import ApiError, Informer, KubeClient, KubeConfig, path_for
from .controlplane import ControlPlane, ControlPlaneSettings, stop_marked_processes
from .dns import HostsFileWriter
from .fleet import Fleet, NodeNaming
from .hollow import HollowNodes, HollowSettings
from .kubelet import MARK_POD, Kubelet, KubeletConfig, signal_marked
from .loop_thread import LoopThread
from .marks import signal_matching
from .metrics_api import SERVING_DNS_NAME, MetricsApiServer, serve_metrics_api
from .nodes import PROFILES, Degradation
from .podnet import IpAllocator, library
from .volumes import Provisioner, default_storage_class

log = logging.getLogger(__name__)

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
    hollow: HollowSettings = field(default_factory=HollowSettings)
    """How the hollow nodes that ``LocalCluster.hollow`` adds behave (their Lease renewals must come
    well within ``node_monitor_grace_seconds``)."""


async def wait_default_service_account(client: KubeClient) -> None:
    """ServiceAccount admission refuses pods until the controller manager made ``default``."""
    while True:
        try:
            await client.get(path_for("serviceaccounts", "default", "default"))
            return
        except ApiError as error:
            if error.status != 404:
                raise
        await asyncio.sleep(0.1)


class LocalCluster:
    """The embedded cluster; a context manager. Fault methods are safe to call from any thread."""

    def __init__(self, settings: LocalClusterSettings) -> None:
        if settings.profile not in PROFILES:
            raise ValueError(f"unknown node profile {settings.profile!r}; known: {', '.join(PROFILES)}")
        self.settings = settings
        self.state_dir = Path(settings.state_dir).resolve()
        self.cluster_id = uuid.uuid4().hex
        self.control_plane: ControlPlane | None = None
        self._loop = LoopThread("rtj-local-cluster")
        self._fleet: Fleet | None = None
        self._informers: dict[str, Informer] = {}
        self._client: KubeClient | None = None
        self._ips = IpAllocator()
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
    def _nodes(self) -> Fleet:
        if self._fleet is None:
            raise RuntimeError("the local cluster is not running")
        return self._fleet

    @property
    def hosts_file(self) -> Path:
        return self.state_dir / "hosts"

    @property
    def node_names(self) -> list[str]:
        return self._fleet.names if self._fleet is not None else []

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory of a running pod (its logs, volumes), if a kubelet runs it."""
        worker = self._nodes.find_worker(namespace, name)
        return worker.dir if worker is not None else None

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
        self._loop.start()
        try:
            self._loop.call(self._astart(), timeout=self.settings.start_timeout_seconds)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        log.info("local cluster up in %.2fs: %s", self.start_seconds, self.kubeconfig_path)

    def stop(self) -> None:
        """Kill every process the kubelets started, stop the controllers and the API server."""
        self._loop.stop(self._astop)
        kill_cluster_processes(self.cluster_id)
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        stop_marked_processes(self.cluster_id)
        self._ips.release()

    async def _astart(self) -> None:
        self._client = KubeClient(KubeConfig(self.kubeconfig_path), user_agent="rtj-local-controllers")
        await self._start_informers(self._client)
        with contextlib.suppress(ApiError):
            await self._client.create(path_for("storageclasses"), default_storage_class())
        self._start_controllers(self._client)
        self._fleet = Fleet(
            naming=NodeNaming(self.settings.node_name_prefix, self.settings.zones),
            kubelet_config=self._kubelet_config(),
            control_plane=self._control_plane,
            admin=self._client,
            informers=self._informers,
            ips=self._ips,
        )
        for _ in range(self.settings.nodes):
            await self._fleet.add(None, self.settings.profile, self.settings.gpu_taint)
        await self._fleet.wait_ready(self._fleet.names)
        await wait_default_service_account(self._client)

    async def _start_informers(self, client: KubeClient) -> None:
        for resource in INFORMED:
            informer = Informer(client, resource)
            self._informers[resource] = informer
            self._loop.spawn(informer.run(), f"informer {resource}")
        for informer in self._informers.values():
            await informer.synced()

    def _start_controllers(self, client: KubeClient) -> None:
        """What Kubernetes does not ship for this use: DNS through a hosts file, the volume
        provisioner and the metrics API."""
        informers = self._informers
        self._loop.spawn(
            HostsFileWriter(self.hosts_file, informers["pods"], informers["services"]).run(), "dns"
        )
        provisioner = Provisioner(
            client,
            informers["persistentvolumeclaims"],
            informers["persistentvolumes"],
            informers["storageclasses"],
            self.state_dir,
        )
        self._loop.spawn(provisioner.run(), "volume-provisioner")
        metrics = MetricsApiServer(
            client,
            informers["nodes"],
            informers["pods"],
            self._control_plane.pki_serving("metrics-server", dns_names=(SERVING_DNS_NAME,)),
            self._control_plane.ca_path,
        )
        self._loop.spawn(serve_metrics_api(metrics), "metrics-api")

    def _kubelet_config(self) -> KubeletConfig:
        settings = self.settings
        return KubeletConfig(
            state_dir=self.state_dir,
            api_host="127.0.0.1",
            api_port=self._control_plane.ports["apiserver"],
            hosts_file=self.hosts_file,
            bin_dir=settings.bin_dir,
            heartbeat_interval_seconds=settings.heartbeat_interval_seconds,
            node_status_interval_seconds=settings.node_status_interval_seconds,
            restart_backoff_seconds=settings.restart_backoff_seconds,
            max_restart_backoff_seconds=settings.max_restart_backoff_seconds,
            image_entrypoints=IMAGE_ENTRYPOINTS,
            extra_env={MARK_CLUSTER: self.cluster_id},
        )

    async def _astop(self) -> None:
        if self._fleet is not None:
            await self._fleet.close()
        await self._loop.cancel_tasks()
        if self._client is not None:
            await self._client.close()

    # -- faults (callable from any thread) -----------------------------------------------------

    def add_node(
        self, name: str | None = None, *, profile: str | None = None, gpu_taint: bool | None = None
    ) -> str:
        """Register a new node (Ready once its kubelet posts status); returns its name."""
        profile_name = profile or self.settings.profile
        if profile_name not in PROFILES:
            raise ValueError(f"unknown node profile {profile_name!r}")
        taint = self.settings.gpu_taint if gpu_taint is None else gpu_taint
        nodes = self._nodes

        async def add() -> str:
            added = await nodes.add(name, profile_name, taint)
            await nodes.wait_ready([added])
            return added

        return self._loop.call(add())

    def kill_node(self, name: str) -> None:
        """The machine dies: its pods' processes are SIGKILLed, heartbeats and status updates stop.
        The API objects stay as they are; the lifecycle controller notices after the grace period."""
        self._loop.call(self._nodes.kill(name))

    def partition_node(self, name: str) -> None:
        """The node loses the API server: processes keep running, nothing is reported."""
        self._loop.call(self._nodes.change(name, Kubelet.partition))

    def heal_node(self, name: str) -> None:
        """End a partition or NotReady: heartbeats resume, the node turns Ready again, status
        catches up."""
        self._loop.call(self._nodes.change(name, Kubelet.heal))

    def make_node_not_ready(self, name: str, message: str = "container runtime is down") -> None:
        """The kubelet keeps its lease but reports Ready=False (reason KubeletNotReady): the
        lifecycle controller adds the not-ready taints and evicts by toleration. Processes keep
        running. ``heal_node`` ends it."""
        self._loop.call(self._nodes.change(name, lambda kubelet: kubelet.set_not_ready(message)))

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
        degradation = Degradation(tuple(dict(c) for c in conditions), dict(allocatable or {}))
        self._loop.call(self._nodes.change(name, lambda kubelet: kubelet.degrade(degradation)))

    def delete_node(self, name: str) -> None:
        """Kill the node and delete its Node object (pod GC then removes its pods)."""
        self._loop.call(self._nodes.delete(name))

    def kill_container(self, namespace: str, pod: str, container: str | None = None) -> int:
        """SIGKILL a container's processes (all containers of the pod when None); the kubelet then
        reports the exit and applies the restart policy. Returns how many processes were signalled."""
        worker = self._nodes.find_worker(namespace, pod)
        if worker is None:
            raise KeyError(f"no running pod {namespace}/{pod}")
        return signal_marked(worker.uid, container, signal.SIGKILL)

    @property
    def hollow(self) -> HollowControl:
        """The cluster's hollow nodes (``rtj_localcluster.hollow``), mixed with its process nodes."""
        return HollowControl(self._loop, self._nodes, self.settings)

    def node_ready_status(self, name: str) -> str | None:
        """The Ready condition's status as the cluster's informer sees it (None: no such node)."""
        return self._nodes.ready_status(name)


class HollowControl:
    """Hollow nodes added, lost and recovered from any thread; named ``hollow-<i>``, taking the
    cluster's zones round-robin."""

    def __init__(self, loop: LoopThread, fleet: Fleet, settings: LocalClusterSettings) -> None:
        self._loop, self._fleet, self._settings = loop, fleet, settings

    @property
    def names(self) -> list[str]:
        agent = self._fleet.hollow
        return agent.names if agent is not None else []

    def zone_of(self, name: str) -> str:
        agent = self._fleet.hollow
        if agent is None:
            raise KeyError(f"no hollow node {name!r}")
        return agent.zone_of(name)

    def add(
        self,
        count: int,
        *,
        profile: str = "p5.48xlarge",
        zones: Sequence[str] | None = None,
        gpu_taint: bool = False,
        timeout: float = 900,
    ) -> list[str]:
        """Register `count` more hollow nodes and wait until every one is Ready; returns their names."""
        if profile not in PROFILES:
            raise ValueError(f"unknown node profile {profile!r}; known: {', '.join(PROFILES)}")
        zone_names = tuple(zones or self._settings.zones)
        first = len(self.names)
        names = [f"hollow-{first + i}" for i in range(count)]
        placed = [zone_names[(first + i) % len(zone_names)] for i in range(count)]
        added = self._fleet.add_hollow(names, placed, PROFILES[profile], gpu_taint, self._settings.hollow)
        return self._loop.call(added, timeout=timeout)

    def lose(self, names: Sequence[str]) -> None:
        """The machines are gone: their Leases go stale and their pods' stand-ins stop answering."""
        self._loop.call(self._change(lambda agent: agent.lose(names)))

    def recover(self, names: Sequence[str]) -> None:
        """The machines are back: their Leases are renewed again."""
        self._loop.call(self._change(lambda agent: agent.recover(names)))

    async def _change(self, how: Callable[[HollowNodes], None]) -> None:
        if self._fleet.hollow is None:
            raise KeyError("the cluster has no hollow nodes")
        how(self._fleet.hollow)
