"""The local cluster's Metrics API (``metrics.k8s.io/v1beta1``), so that ``kubectl top pod`` and
``kubectl top node`` work: what metrics-server does, in the cluster's own process.

Every ``RESOLUTION_SECONDS`` it scrapes each node's kubelet at ``/metrics/resource`` (the address and
port in the Node's status, the cluster CA verifying the kubelet), keeps each node's last two scrapes
and serves the usage between them: CPU as the rate of the CPU-seconds counters, memory as the last
working set. It serves HTTPS on loopback with a certificate for ``metrics-server.kube-system.svc``;
the API server's aggregator reaches it through the ``v1beta1.metrics.k8s.io`` APIService and an
ExternalName Service (a ClusterIP Service would need Endpoints, and Endpoints refuse the loopback
addresses every local pod has). Requests come through the aggregator only after the API server has
authorized them; label and field selectors are handed to the API server to resolve.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from . import resource_metrics as rm
from .certs import CertPair
from .client import ApiError, Informer, KubeClient, path_for
from .logserver import listen_on_loopback

log = logging.getLogger(__name__)

GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
SERVICE_NAME = "metrics-server"
SERVICE_NAMESPACE = "kube-system"
SERVING_DNS_NAME = f"{SERVICE_NAME}.{SERVICE_NAMESPACE}.svc"
APISERVICE_NAME = f"{VERSION}.{GROUP}"
RESOLUTION_SECONDS = 10.0
SCRAPE_TIMEOUT_SECONDS = 5.0
ContainerKey = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True)
class Point:
    """One scraped sample: CPU seconds so far, working set bytes, when."""

    cpu_seconds: float
    memory_bytes: float
    timestamp: float


@dataclass(frozen=True)
class NodeScrape:
    """A node's ``/metrics/resource`` page: the node's point and each running container's."""

    node: Point | None
    containers: dict[ContainerKey, Point] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """Usage over a window: CPU cores on average, the last working set."""

    cpu_cores: float
    memory_bytes: float
    timestamp: float
    window_seconds: float


def parse_scrape(text: str) -> NodeScrape:
    """The node's and containers' points in a ``/metrics/resource`` page (samples without a time, or
    a container without both series, are left out)."""
    cpu: dict[ContainerKey, tuple[float, float]] = {}
    memory: dict[ContainerKey, float] = {}
    node_cpu: tuple[float, float] | None = None
    node_memory: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.timestamp is None:
                continue
            ts = float(sample.timestamp)
            key = (
                sample.labels.get("namespace", ""),
                sample.labels.get("pod", ""),
                sample.labels.get("container", ""),
            )
            if sample.name == f"{rm.NODE_CPU}_total":
                node_cpu = (sample.value, ts)
            elif sample.name == rm.NODE_MEMORY:
                node_memory = sample.value
            elif sample.name == f"{rm.CONTAINER_CPU}_total":
                cpu[key] = (sample.value, ts)
            elif sample.name == rm.CONTAINER_MEMORY:
                memory[key] = sample.value
    node = None
    if node_cpu is not None and node_memory is not None:
        node = Point(node_cpu[0], node_memory, node_cpu[1])
    containers = {key: Point(seconds, memory[key], ts) for key, (seconds, ts) in cpu.items() if key in memory}
    return NodeScrape(node, containers)


def usage_between(before: Point, after: Point) -> Usage | None:
    """The usage from ``before`` to ``after``; None when the counter went back (a restarted
    container) or no time passed."""
    window = after.timestamp - before.timestamp
    if window <= 0 or after.cpu_seconds < before.cpu_seconds:
        return None
    return Usage(
        (after.cpu_seconds - before.cpu_seconds) / window, after.memory_bytes, after.timestamp, window
    )


def cpu_quantity(cores: float) -> str:
    return f"{round(cores * 1e9)}n"


def memory_quantity(memory_bytes: float) -> str:
    return f"{int(memory_bytes) // 1024}Ki"


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _usage_fields(usage: Usage) -> dict[str, str]:
    return {"timestamp": _rfc3339(usage.timestamp), "window": f"{usage.window_seconds:.3f}s"}


def _resource_usage(usage: Usage) -> dict[str, str]:
    return {"cpu": cpu_quantity(usage.cpu_cores), "memory": memory_quantity(usage.memory_bytes)}


class ScrapeHistory:
    """Each node's last two scrapes, and the usage between them."""

    def __init__(self) -> None:
        self._scrapes: dict[str, tuple[NodeScrape | None, NodeScrape]] = {}

    def record(self, node: str, scrape: NodeScrape) -> None:
        previous = self._scrapes.get(node)
        self._scrapes[node] = (previous[1] if previous else None, scrape)

    def forget(self, node: str) -> None:
        self._scrapes.pop(node, None)

    def node_usage(self, node: str) -> Usage | None:
        before, after = self._scrapes.get(node, (None, None))
        if before is None or after is None or before.node is None or after.node is None:
            return None
        return usage_between(before.node, after.node)

    def container_usage(self) -> dict[ContainerKey, Usage]:
        """Every container with a usage over its node's last window."""
        result: dict[ContainerKey, Usage] = {}
        for before, after in self._scrapes.values():
            if before is None:
                continue
            for key, point in after.containers.items():
                earlier = before.containers.get(key)
                usage = usage_between(earlier, point) if earlier is not None else None
                if usage is not None:
                    result[key] = usage
        return result

    def pod_usage(self) -> dict[tuple[str, str], list[tuple[str, Usage]]]:
        """(namespace, pod) -> each container's usage."""
        pods: dict[tuple[str, str], list[tuple[str, Usage]]] = {}
        for (namespace, pod, container), usage in sorted(self.container_usage().items()):
            pods.setdefault((namespace, pod), []).append((container, usage))
        return pods


def kubelet_url(node: Mapping[str, Any]) -> str | None:
    """Where a Node's kubelet serves: its InternalIP and daemon endpoint port."""
    status = node.get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    addresses = [a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"]
    if not port or not addresses:
        return None
    return f"https://{addresses[0]}:{port}"


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason}
    return web.json_response({**body, "code": code}, status=code)


class MetricsApiServer:
    """Scrapes the kubelets and serves ``metrics.k8s.io/v1beta1`` for the aggregator."""

    def __init__(
        self,
        client: KubeClient,
        nodes: Informer,
        pods: Informer,
        serving: CertPair,
        ca: Path,
        *,
        resolution_seconds: float = RESOLUTION_SECONDS,
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._pods = pods
        self._ca = ca
        self._resolution = resolution_seconds
        self.scrapes = ScrapeHistory()
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.load_cert_chain(str(serving.cert), str(serving.key))
        self._kubelet_ssl = ssl.create_default_context(cafile=str(ca))
        self._session: aiohttp.ClientSession | None = None
        app = web.Application()
        base = f"/apis/{GROUP_VERSION}"
        app.router.add_get(base, self._resources)
        app.router.add_get(f"{base}/nodes", self._node_list)
        app.router.add_get(f"{base}/nodes/{{name}}", self._node_one)
        app.router.add_get(f"{base}/pods", self._pod_list)
        app.router.add_get(f"{base}/namespaces/{{namespace}}/pods", self._pod_list)
        app.router.add_get(f"{base}/namespaces/{{namespace}}/pods/{{name}}", self._pod_one)
        for probe in ("/healthz", "/livez", "/readyz"):
            app.router.add_get(probe, self._healthy)
        self._runner = web.AppRunner(app, access_log=None)
        self.port = 0

    async def start(self) -> int:
        self.port = await listen_on_loopback(self._runner, self._ssl)
        return self.port

    async def close(self) -> None:
        await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- scraping ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Scrape every node each resolution, for ever."""
        while True:
            await self.scrape_once()
            await asyncio.sleep(self._resolution)

    async def scrape_once(self) -> None:
        nodes = {n["metadata"]["name"]: kubelet_url(n) for n in self._nodes.items()}
        results = await asyncio.gather(*(self._scrape(url) for url in nodes.values() if url))
        scraped = dict(zip([name for name, url in nodes.items() if url], results, strict=True))
        for name in nodes:
            scrape = scraped.get(name)
            if scrape is None:
                self.scrapes.forget(name)  # an unreachable kubelet has no metrics, not stale ones
            else:
                self.scrapes.record(name, scrape)

    async def _scrape(self, url: str) -> NodeScrape | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS))
        try:
            async with self._session.get(f"{url}/metrics/resource", ssl=self._kubelet_ssl) as response:
                if response.status != 200:
                    return None
                return parse_scrape(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.debug("scraping %s failed: %s", url, error)
            return None

    # -- registration --------------------------------------------------------------------------

    async def register(self) -> None:
        """The ExternalName Service and the APIService that send the aggregator here."""
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
            "spec": {
                "type": "ExternalName",
                "externalName": "localhost",
                "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}],
            },
        }
        await self._create_or_patch(path_for("services", SERVICE_NAMESPACE), SERVICE_NAME, service)
        apiservice = {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE_NAME},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "service": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE, "port": self.port},
                "caBundle": base64.b64encode(self._ca.read_bytes()).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        }
        await self._create_or_patch(path_for("apiservices"), APISERVICE_NAME, apiservice)

    async def _create_or_patch(self, collection: str, name: str, body: dict[str, Any]) -> None:
        try:
            await self._client.create(collection, body)
        except ApiError as error:
            if error.status != 409:
                raise
            await self._client.patch(f"{collection}/{name}", {"spec": body["spec"]})

    # -- the API -------------------------------------------------------------------------------

    async def _healthy(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _resources(self, request: web.Request) -> web.Response:
        def resource(name: str, kind: str, namespaced: bool) -> dict[str, Any]:
            return {
                "name": name,
                "singularName": "",
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["get", "list"],
            }

        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": GROUP_VERSION,
                "resources": [resource("nodes", "NodeMetrics", False), resource("pods", "PodMetrics", True)],
            }
        )

    async def _selected(
        self, resource: str, namespace: str | None, query: Mapping[str, str]
    ) -> set[str] | None:
        """The names the request's label and field selectors select (None: no selector), resolved by
        the API server, which also refuses a malformed one."""
        selectors = {k: v for k, v in query.items() if k in ("labelSelector", "fieldSelector") and v}
        if not selectors:
            return None
        listed = await self._client.get(path_for(resource, namespace), **selectors)
        return {
            f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in listed.get("items") or []
        }

    def _node_item(self, name: str, usage: Usage) -> dict[str, Any]:
        node = self._nodes.get(name) or {}
        meta = node.get("metadata") or {}
        return {
            "metadata": {
                "name": name,
                "creationTimestamp": meta.get("creationTimestamp"),
                "labels": meta.get("labels") or {},
            },
            **_usage_fields(usage),
            "usage": _resource_usage(usage),
        }

    def _pod_item(self, namespace: str, name: str, containers: list[tuple[str, Usage]]) -> dict[str, Any]:
        pod = self._pods.get(name, namespace) or {}
        meta = pod.get("metadata") or {}
        last = max(containers, key=lambda c: c[1].timestamp)[1]
        return {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "creationTimestamp": meta.get("creationTimestamp"),
                "labels": meta.get("labels") or {},
            },
            **_usage_fields(last),
            "containers": [{"name": container, "usage": _resource_usage(u)} for container, u in containers],
        }

    async def _node_list(self, request: web.Request) -> web.Response:
        try:
            selected = await self._selected("nodes", None, request.query)
        except ApiError as error:
            return web.Response(status=error.status, text=error.body, content_type="application/json")
        items = []
        for node in sorted(n["metadata"]["name"] for n in self._nodes.items()):
            usage = self.scrapes.node_usage(node)
            if usage is not None and (selected is None or f"/{node}" in selected):
                items.append(self._node_item(node, usage))
        return web.json_response(
            {"kind": "NodeMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}
        )

    async def _node_one(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        usage = self.scrapes.node_usage(name)
        if usage is None:
            return _status(404, "NotFound", f'nodemetrics.{GROUP} "{name}" not found')
        return web.json_response(
            {"kind": "NodeMetrics", "apiVersion": GROUP_VERSION, **self._node_item(name, usage)}
        )

    async def _pod_list(self, request: web.Request) -> web.Response:
        namespace = request.match_info.get("namespace")
        try:
            selected = await self._selected("pods", namespace, request.query)
        except ApiError as error:
            return web.Response(status=error.status, text=error.body, content_type="application/json")
        items = [
            self._pod_item(ns, pod, containers)
            for (ns, pod), containers in self.scrapes.pod_usage().items()
            if (namespace is None or ns == namespace) and (selected is None or f"{ns}/{pod}" in selected)
        ]
        return web.json_response(
            {"kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}
        )

    async def _pod_one(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        containers = self.scrapes.pod_usage().get((namespace, name))
        if not containers:
            return _status(404, "NotFound", f'podmetrics.{GROUP} "{namespace}/{name}" not found')
        return web.json_response(
            {"kind": "PodMetrics", "apiVersion": GROUP_VERSION, **self._pod_item(namespace, name, containers)}
        )


async def serve_metrics_api(server: MetricsApiServer) -> None:
    """Start, register and scrape until cancelled; then close."""
    try:
        await server.start()
        await server.register()
        await server.run()
    finally:
        with contextlib.suppress(Exception):
            await server.close()
