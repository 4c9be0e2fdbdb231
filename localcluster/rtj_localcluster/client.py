"""A small asyncio client for a Kubernetes API server, and list+watch informers on top of it.

The local cluster's controllers (``scheduler``, ``nodes``, ``kubelet``, ``volumes``, ``dns``) talk to
the API server only through this module, over HTTPS with the kubeconfig's credentials, as the real
components do. One ``Informer`` per resource kind keeps a cache from a list and a resumed watch and
wakes its subscribers on every change; the controllers read the cache and write with PATCH/POST/
DELETE. The official ``kubernetes`` client is not used here: it is synchronous and costs a thread
per watch, which a 2-core machine running several nodes cannot spare.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rtj_contract.times import format_rfc3339, format_rfc3339_micro

log = logging.getLogger(__name__)

# resource -> (API prefix, namespaced)
RESOURCES: dict[str, tuple[str, bool]] = {
    "pods": ("/api/v1", True),
    "nodes": ("/api/v1", False),
    "services": ("/api/v1", True),
    "endpoints": ("/api/v1", True),
    "events": ("/api/v1", True),
    "namespaces": ("/api/v1", False),
    "configmaps": ("/api/v1", True),
    "secrets": ("/api/v1", True),
    "serviceaccounts": ("/api/v1", True),
    "persistentvolumeclaims": ("/api/v1", True),
    "persistentvolumes": ("/api/v1", False),
    "leases": ("/apis/coordination.k8s.io/v1", True),
    "storageclasses": ("/apis/storage.k8s.io/v1", False),
    "apiservices": ("/apis/apiregistration.k8s.io/v1", False),
}


def now_rfc3339() -> str:
    return format_rfc3339(datetime.now(UTC))


def now_micro() -> str:
    """MicroTime, as Lease renewTime uses."""
    return format_rfc3339_micro(datetime.now(UTC))


def path_for(
    resource: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None
) -> str:
    prefix, namespaced = RESOURCES[resource]
    path = prefix
    if namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{resource}"
    if name:
        path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
    return path


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class KubeConfig:
    """The parts of a kubeconfig the client needs: server URL, CA, and a token or client cert."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        data = yaml.safe_load(Path(path).read_text())
        current = data.get("current-context")
        contexts = {c["name"]: c["context"] for c in data.get("contexts") or []}
        context = contexts.get(current) or next(iter(contexts.values()))
        cluster = {c["name"]: c["cluster"] for c in data["clusters"]}[context["cluster"]]
        user = {u["name"]: u["user"] for u in data.get("users") or []}.get(context.get("user", ""), {})
        self.server: str = cluster["server"].rstrip("/")
        self.namespace: str = context.get("namespace", "default")
        self.insecure = bool(cluster.get("insecure-skip-tls-verify"))
        self.ca_pem = self._read(cluster, "certificate-authority", "certificate-authority-data", path)
        self.cert_pem = self._read(user, "client-certificate", "client-certificate-data", path)
        self.key_pem = self._read(user, "client-key", "client-key-data", path)
        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        self.token: str | None = token

    @staticmethod
    def _read(
        section: Mapping[str, Any], key: str, data_key: str, base: str | os.PathLike[str]
    ) -> bytes | None:
        if section.get(key):
            return (Path(base).parent / str(section[key])).read_bytes()
        if section.get(data_key):
            return base64.b64decode(section[data_key])
        return None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode() if self.ca_pem else None)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_pem and self.key_pem:
            # load_cert_chain reads files only; they exist just for the call.
            with tempfile.TemporaryDirectory(prefix="rtj-kubeconfig-") as scratch:
                cert, key = Path(scratch) / "client.crt", Path(scratch) / "client.key"
                cert.write_bytes(self.cert_pem)
                key.write_bytes(self.key_pem)
                context.load_cert_chain(str(cert), str(key))
        return context


class KubeClient:
    """JSON over HTTPS; one aiohttp session, created lazily inside the running loop."""

    def __init__(self, config: KubeConfig, *, user_agent: str = "rtj-localcluster") -> None:
        self.config = config
        self._ssl = config.ssl_context()
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if config.token:
            self._headers["Authorization"] = f"Bearer {config.token}"
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], **kwargs: Any) -> KubeClient:
        return cls(KubeConfig(path), **kwargs)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=64)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=aiohttp.ClientTimeout(total=30)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # TLS transports finish closing on later loop iterations; let them, so that no socket
            # is left for the garbage collector (a ResourceWarning) when the loop stops.
            await asyncio.sleep(0.1)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._get_session().request(
            method, self.config.server + path, data=data, params=params, headers=headers
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, text)
            return json.loads(text) if text else None

    async def get(self, path: str, **params: str) -> Any:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[kind]
        return await self.request("PATCH", path, body, content_type=content_type)

    async def delete(
        self, path: str, *, grace_period_seconds: int | None = None, uid: str | None = None
    ) -> Any:
        """DELETE; with ``uid`` only that incarnation of the name (409 if it was replaced)."""
        body: dict[str, Any] | None = None
        if grace_period_seconds is not None or uid is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if grace_period_seconds is not None:
                body["gracePeriodSeconds"] = grace_period_seconds
            if uid is not None:
                body["preconditions"] = {"uid": uid}
        return await self.request("DELETE", path, body)

    async def watch(
        self, path: str, resource_version: str, *, timeout_seconds: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events from ``resource_version``; ends when the server closes the stream."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        async with self._get_session().get(
            self.config.server + path, params=params, timeout=timeout
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, await response.text())
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)

    async def post_event(
        self, obj: Mapping[str, Any], event_type: str, reason: str, message: str, *, component: str
    ) -> None:
        """Record a core/v1 Event about ``obj`` (best effort: events never fail a controller)."""
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.create(path_for("events", namespace), event)
        except (ApiError, aiohttp.ClientError) as error:
            log.warning("could not record event %s: %s", reason, error)


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


class Informer:
    """A list+watch cache of one resource kind (all namespaces), with change subscribers."""

    def __init__(self, client: KubeClient, resource: str) -> None:
        self.resource = resource
        self._client = client
        self._cache: dict[str, dict[str, Any]] = {}
        self._subscribers: list[Callable[[], None]] = []
        self._synced = asyncio.Event()

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        self._subscribers.remove(callback)

    async def synced(self) -> None:
        await self._synced.wait()

    def items(self) -> list[dict[str, Any]]:
        return list(self._cache.values())

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._cache.get(f"{namespace}/{name}" if namespace else name)

    def _notify(self) -> None:
        for callback in self._subscribers:
            callback()

    async def run(self) -> None:
        path = path_for(self.resource)
        while True:
            try:
                listing = await self._client.get(path)
                self._cache = {object_key(item): item for item in listing.get("items") or []}
                version = str(listing.get("metadata", {}).get("resourceVersion", ""))
                self._synced.set()
                self._notify()
                while True:
                    async for event in self._client.watch(path, version):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code", 500)), json.dumps(obj))
                        version = str(obj.get("metadata", {}).get("resourceVersion", version))
                        if kind == "BOOKMARK":
                            continue
                        if kind == "DELETED":
                            self._cache.pop(object_key(obj), None)
                        else:
                            self._cache[object_key(obj)] = obj
                        self._notify()
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError, OSError) as error:
                # 410 Gone (or a broken stream): relist, as client-go's reflector does.
                log.debug("informer %s restarting: %s", self.resource, error)
                await asyncio.sleep(0.5)


async def run_level_triggered(
    name: str,
    informers: Sequence[Informer],
    wake: asyncio.Event,
    sync: Callable[[], Awaitable[None]],
    *,
    period_seconds: float,
    error_delay_seconds: float = 0.0,
) -> None:
    """A controller's main loop: after the informers' first lists, run `sync` once per change they
    report (through `wake`) and at least every `period_seconds`. A failing pass is logged, not fatal:
    the next one starts from what is observed then (after `error_delay_seconds`, if given)."""
    for informer in informers:
        await informer.synced()
    while True:
        wake.clear()
        try:
            await sync()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s pass failed", name)
            if error_delay_seconds:
                await asyncio.sleep(error_delay_seconds)
                wake.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=period_seconds)


class SyncKubeClient:
    """A blocking façade over ``KubeClient`` for tests and the CLI (its own private event loop)."""

    def __init__(self, kubeconfig: str | os.PathLike[str]) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = KubeClient.from_kubeconfig(kubeconfig, user_agent="rtj-local-cli")

    def _run(self, coroutine: Any) -> Any:
        return self._loop.run_until_complete(coroutine)

    def get(self, path: str, **params: str) -> Any:
        return self._run(self._client.get(path, **params))

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def create(self, path: str, body: Any) -> Any:
        return self._run(self._client.create(path, body))

    def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        return self._run(self._client.patch(path, body, kind=kind))

    def delete(self, path: str, *, grace_period_seconds: int | None = None) -> Any:
        return self._run(self._client.delete(path, grace_period_seconds=grace_period_seconds))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.close()

    def __enter__(self) -> SyncKubeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
