"""The HTTPS front of the API server (aiohttp) and :class:`ApiServer`, which runs it in a thread.

Routing follows the Kubernetes REST layout (``/api/v1/...``, ``/apis/<group>/<version>/...``,
namespaced or cluster paths, subresources, the legacy ``/watch/`` prefix); every request goes to
``core.Cluster`` and every error comes back as a ``Status``. Content negotiation covers what
clients ask for: JSON (protobuf requests get JSON, which client-go accepts), ``as=Table`` for kubectl,
``as=PartialObjectMetadata[List]``; discovery is served in the legacy (non-aggregated) form, to
which kubectl falls back by itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from ..certs import make_pki
from . import openapi, protobuf, tables
from .core import Cluster
from .errors import ApiError, bad_request, method_not_allowed, not_found
from .resources import Registry, ResourceType, discovery_group, discovery_groups, discovery_resource_list
from .store import Store

log = logging.getLogger(__name__)

Obj = dict[str, Any]
KUBERNETES_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-rtj-local",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


def _json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error_response(error: ApiError) -> web.Response:
    return _json_response(error.status(), error.code)


def _accept_as(request: web.Request) -> str | None:
    """``Table``, ``PartialObjectMetadata``/``...List`` when the client asks for it, else None."""
    accept = request.headers.get("Accept", "")
    for part in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in part.split(";")[1:] if "=" in p)
        if params.get("g") == "meta.k8s.io" and params.get("as") in (
            "Table",
            "PartialObjectMetadata",
            "PartialObjectMetadataList",
        ):
            return params["as"]
    return None


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


class _Route:
    __slots__ = ("name", "namespace", "rt", "subresource", "watch")

    def __init__(
        self, rt: ResourceType, namespace: str | None, name: str | None, subresource: str | None, watch: bool
    ) -> None:
        self.rt, self.namespace, self.name, self.subresource, self.watch = (
            rt,
            namespace,
            name,
            subresource,
            watch,
        )


class App:
    """The aiohttp application around one :class:`Cluster`."""

    def __init__(
        self, cluster: Cluster, log_root: Path, bookmark_interval: float, server_address: Callable[[], str]
    ) -> None:
        self.cluster = cluster
        self.registry = cluster.registry
        self.log_root = log_root
        self.bookmark_interval = bookmark_interval
        self.server_address = server_address
        self.stopping = asyncio.Event()

    def make(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._errors])
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return _error_response(error)
        except (web.HTTPException, asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            log.exception("internal error serving %s %s", request.method, request.path)
            return _error_response(
                ApiError(
                    500,
                    "InternalError",
                    f"an error on the server has prevented the request from succeeding: {exc}",
                )
            )

    # -- routing -----------------------------------------------------------------------------------

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.method not in ("GET", "HEAD") and (not parts or parts[0] not in ("api", "apis")):
            raise method_not_allowed()
        if not parts:
            return _json_response(
                {
                    "paths": [
                        "/api",
                        "/api/v1",
                        "/apis",
                        "/healthz",
                        "/livez",
                        "/openapi/v2",
                        "/openapi/v3",
                        "/readyz",
                        "/version",
                    ]
                }
            )
        head = parts[0]
        if head in ("healthz", "readyz", "livez"):
            return web.Response(text="ok")
        if head == "version":
            return _json_response(KUBERNETES_VERSION)
        if head == "openapi":
            return self._openapi(request, parts[1:])
        if head == "api":
            if len(parts) == 1:
                return _json_response(
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": self.server_address()}
                        ],
                    }
                )
            if parts[1] != "v1":
                raise not_found("", "", request.path)
            if len(parts) == 2:
                return _json_response(discovery_resource_list(self.registry, "", "v1"))
            return await self._resource(request, "", "v1", parts[2:])
        if head == "apis":
            if len(parts) == 1:
                return _json_response(discovery_groups(self.registry))
            group = parts[1]
            if group not in self.registry.groups():
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            if len(parts) == 2:
                return _json_response(discovery_group(self.registry, group))
            version = parts[2]
            if version not in self.registry.groups()[group]:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            if len(parts) == 3:
                return _json_response(discovery_resource_list(self.registry, group, version))
            return await self._resource(request, group, version, parts[3:])
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _openapi(self, request: web.Request, parts: list[str]) -> web.Response:
        if parts == ["v2"]:
            accept = request.headers.get("Accept", "")
            if "protobuf" in accept:
                # An empty Document message: no definitions, so client-side validation defers to us.
                return web.Response(body=b"", content_type=openapi.OPENAPI_V2_PROTOBUF)
            return _json_response(
                {
                    "swagger": "2.0",
                    "info": {"title": "Kubernetes", "version": "v1.32.0"},
                    "paths": {},
                    "definitions": {},
                }
            )
        if parts == ["v3"]:
            return _json_response(openapi.index_document(self.registry))
        if len(parts) >= 3 and parts[0] == "v3":
            if parts[1] == "api" and len(parts) == 3:
                return _json_response(openapi.group_version_document(self.registry, "", parts[2]))
            if parts[1] == "apis" and len(parts) == 4 and parts[2] in self.registry.groups():
                return _json_response(openapi.group_version_document(self.registry, parts[2], parts[3]))
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _route(self, group: str, version: str, parts: list[str]) -> _Route:
        watch = False
        if parts and parts[0] == "watch":
            watch = True
            parts = parts[1:]
        namespace: str | None = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            candidate = self.registry.get(group, version, parts[2])
            if candidate is not None and candidate.namespaced:
                namespace = parts[1]
                parts = parts[2:]
        if not parts:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        rt = self.registry.get(group, version, parts[0])
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if rt.namespaced and namespace is None and len(parts) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        name = parts[1] if len(parts) > 1 else None
        subresource = parts[2] if len(parts) > 2 else None
        if len(parts) > 3 or (subresource is not None and subresource not in rt.subresources):
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return _Route(rt, namespace, name, subresource, watch)

    # -- resources ---------------------------------------------------------------------------------

    async def _resource(
        self, request: web.Request, group: str, version: str, parts: list[str]
    ) -> web.StreamResponse:
        route = self._route(group, version, parts)
        q = request.query
        dry_run = q.get("dryRun") == "All"
        strict = q.get("fieldValidation", "").lower() == "strict"
        method = request.method
        rt = route.rt
        if route.watch or (method == "GET" and route.name is None and _flag(q.get("watch"))):
            if route.name is not None:
                # /watch/.../<name>: a watch filtered to one object.
                return await self._watch(request, rt, route.namespace, f"metadata.name={route.name}")
            return await self._watch(request, rt, route.namespace, None)
        if route.name is None:
            if method == "GET":
                return self._list(request, rt, route.namespace)
            if method == "POST":
                body = await self._body(request)
                created = self.cluster.create(rt, route.namespace, body, dry_run, strict)
                headers = self._warnings(rt, created)
                return _json_response(created, 201, headers)
            if method == "DELETE":
                options = await self._delete_options(request)
                deleted = self.cluster.delete_collection(
                    rt,
                    route.namespace,
                    label_selector=q.get("labelSelector"),
                    field_selector=q.get("fieldSelector"),
                    options=options,
                    dry_run=dry_run,
                )
                return _json_response(
                    {
                        "kind": rt.list_kind,
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(self.cluster.store.rv)},
                        "items": deleted,
                    }
                )
            raise method_not_allowed()
        name = route.name
        sub = route.subresource
        if sub == "log":
            if method != "GET":
                raise method_not_allowed()
            return await self._log(request, rt, route.namespace or "", name)
        if sub in ("eviction", "binding", "token"):
            if method != "POST":
                raise method_not_allowed()
            body = await self._body(request)
            if sub == "eviction":
                self.cluster.evict(rt, route.namespace or "", name, body)
            elif sub == "binding":
                self.cluster.bind(rt, route.namespace or "", name, body)
            else:
                self.cluster.get(rt, route.namespace, name)
                token = base64.urlsafe_b64encode(f"{route.namespace}:{name}:{time.time()}".encode()).decode()
                spec = body.get("spec", {}) if isinstance(body, dict) else {}
                return _json_response(
                    {
                        "kind": "TokenRequest",
                        "apiVersion": "authentication.k8s.io/v1",
                        "metadata": {"name": name, "namespace": route.namespace},
                        "spec": spec,
                        "status": {"token": token, "expirationTimestamp": "2099-01-01T00:00:00Z"},
                    },
                    201,
                )
            return _json_response(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
            )
        if sub == "finalize":
            if method != "PUT":
                raise method_not_allowed()
            return _json_response(self.cluster.get(rt, route.namespace, name))
        if method == "GET":
            obj = self.cluster.get(rt, route.namespace, name)
            return self._render_one(request, rt, obj)
        if method == "PUT":
            body = await self._body(request)
            updated = self.cluster.update(
                rt, route.namespace, name, body, subresource=sub, dry_run=dry_run, strict_fields=strict
            )
            return _json_response(updated, 200, self._warnings(rt, updated))
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            patch_type = _PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    + ", ".join(_PATCH_TYPES),
                )
            body = await self._body(request, yaml_ok=patch_type == "apply")
            patched, was_created = self.cluster.patch(
                rt,
                route.namespace,
                name,
                patch_type,
                body,
                subresource=sub,
                dry_run=dry_run,
                field_manager=q.get("fieldManager"),
                strict_fields=strict,
            )
            return _json_response(patched, 201 if was_created else 200, self._warnings(rt, patched))
        if method == "DELETE":
            if sub is not None:
                raise method_not_allowed()
            options = await self._delete_options(request)
            return _json_response(self.cluster.delete(rt, route.namespace, name, options, dry_run))
        raise method_not_allowed()

    def _warnings(self, rt: ResourceType, obj: Obj) -> dict[str, str] | None:
        if rt.storage_key != ("apiextensions.k8s.io", "customresourcedefinitions"):
            return None
        warnings = self.cluster.crd_warnings(obj)
        if not warnings:
            return None
        return {"Warning": ", ".join('299 - "' + w.replace('"', "'") + '"' for w in warnings)}

    async def _body(self, request: web.Request, yaml_ok: bool = False) -> Any:
        content_type = request.headers.get("Content-Type", "")
        raw = await request.read()
        if not raw:
            return {}
        if "protobuf" in content_type:
            return protobuf.decode(raw)
        if "cbor" in content_type:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json, application/yaml, application/vnd.kubernetes.protobuf",
            )
        try:
            if yaml_ok or "yaml" in content_type:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise bad_request(f"the request body could not be decoded: {exc}") from exc

    async def _delete_options(self, request: web.Request) -> Obj:
        options: Obj = {}
        raw = await request.read()
        if raw and "protobuf" in request.headers.get("Content-Type", ""):
            options.update(protobuf.decode(raw))
        elif raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise bad_request(f"invalid DeleteOptions: {exc}") from exc
            if isinstance(body, dict):
                options.update(body)
        q = request.query
        if "gracePeriodSeconds" in q:
            try:
                options["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
            except ValueError as exc:
                raise bad_request("gracePeriodSeconds must be an integer") from exc
        if "propagationPolicy" in q:
            options["propagationPolicy"] = q["propagationPolicy"]
        if "orphanDependents" in q:
            options["orphanDependents"] = _flag(q["orphanDependents"])
        return options

    def _render_one(self, request: web.Request, rt: ResourceType, obj: Obj) -> web.Response:
        as_kind = _accept_as(request)
        if as_kind == "Table":
            return _json_response(tables.table(rt, [obj], request.query.get("includeObject", "Metadata")))
        if as_kind == "PartialObjectMetadata":
            return _json_response(
                {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata", {}),
                }
            )
        return _json_response(obj)

    def _list(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        q = request.query
        limit = int(q["limit"]) if q.get("limit", "").isdigit() else None
        items, rv, token = self.cluster.list_objects(
            rt,
            namespace,
            label_selector=q.get("labelSelector"),
            field_selector=q.get("fieldSelector"),
            limit=limit,
            continue_token=q.get("continue"),
        )
        meta: Obj = {"resourceVersion": rv}
        if token:
            meta["continue"] = token
        as_kind = _accept_as(request)
        if as_kind == "Table":
            return _json_response(tables.table(rt, items, q.get("includeObject", "Metadata"), list_meta=meta))
        if as_kind in ("PartialObjectMetadataList", "PartialObjectMetadata"):
            return _json_response(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    "items": [
                        {
                            "kind": "PartialObjectMetadata",
                            "apiVersion": "meta.k8s.io/v1",
                            "metadata": i.get("metadata", {}),
                        }
                        for i in items
                    ],
                }
            )
        return _json_response(
            {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}
        )

    # -- watch ---------------------------------------------------------------------------------------

    async def _watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None, name_selector: str | None
    ) -> web.StreamResponse:
        q = request.query
        field_selector = q.get("fieldSelector")
        if name_selector:
            field_selector = f"{field_selector},{name_selector}" if field_selector else name_selector
        watcher = self.cluster.watcher(rt, namespace, q.get("labelSelector"), field_selector)
        rv_text = q.get("resourceVersion", "")
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds", "").isdigit() else 1800.0
        bookmarks = _flag(q.get("allowWatchBookmarks"))
        as_kind = _accept_as(request)
        include_object = q.get("includeObject", "Metadata")
        store = self.cluster.store
        initial: list[Obj] = []
        expired = False
        if rv_text in ("", "0") or _flag(q.get("sendInitialEvents")):
            initial, _, _ = self.cluster.list_objects(
                rt, namespace, label_selector=q.get("labelSelector"), field_selector=field_selector
            )
            store.subscribe(watcher, None)
        else:
            try:
                since = int(rv_text)
            except ValueError as exc:
                raise bad_request(f"invalid resourceVersion {rv_text!r}") from exc
            expired = not store.subscribe(watcher, since)

        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
        )
        response.enable_chunked_encoding()
        first = True

        def frame(event_type: str, obj: Obj) -> bytes:
            nonlocal first
            if as_kind == "Table" and event_type not in ("ERROR", "BOOKMARK"):
                obj = tables.table(rt, [obj], include_object, with_columns=first)
                first = False
            return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"

        try:
            await response.prepare(request)
            if expired:
                status = ApiError(
                    410, "Expired", f"too old resource version: {rv_text} ({store.compacted_rv})"
                ).status()
                await response.write(frame("ERROR", status))
                return response
            for obj in initial:
                await response.write(frame("ADDED", obj))
            if bookmarks and _flag(q.get("sendInitialEvents")):
                await response.write(
                    frame("BOOKMARK", self._bookmark(rt, {"k8s.io/initial-events-end": "true"}))
                )
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.bookmark_interval
            transport = request.transport
            while not self.stopping.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, 1.0, max(next_bookmark - now, 0.01) if bookmarks else 1.0)
                try:
                    event_type, obj = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if transport is None or transport.is_closing():
                        break
                    if bookmarks and time.monotonic() >= next_bookmark and watcher.queue.empty():
                        await response.write(frame("BOOKMARK", self._bookmark(rt)))
                        next_bookmark = time.monotonic() + self.bookmark_interval
                    continue
                if event_type == "CLOSED":
                    break
                await response.write(frame(event_type, self.cluster.view(rt, obj)))
                while not watcher.queue.empty() and not watcher.closed:
                    event_type, obj = watcher.queue.get_nowait()
                    await response.write(frame(event_type, self.cluster.view(rt, obj)))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            store.unsubscribe(watcher)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    def _bookmark(self, rt: ResourceType, annotations: dict[str, str] | None = None) -> Obj:
        meta: Obj = {"resourceVersion": str(self.cluster.store.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    # -- logs ----------------------------------------------------------------------------------------

    def log_path(self, pod: Obj, container: str, previous: bool = False) -> Path:
        meta = pod["metadata"]
        directory = self.log_root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        return directory / (f"{container}.previous.log" if previous else f"{container}.log")

    async def _log(
        self, request: web.Request, rt: ResourceType, namespace: str, name: str
    ) -> web.StreamResponse:
        q = request.query
        pod = self.cluster.get(rt, namespace, name)
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        init = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
        container = q.get("container")
        if not container:
            if len(containers) != 1:
                choices = " ".join(str(c) for c in containers)
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{choices}]"
                )
            container = str(containers[0])
        if container not in containers and container not in init:
            raise bad_request(f"container {container} is not valid for pod {name}")
        path = self.log_path(pod, container, _flag(q.get("previous")))
        if not path.exists():
            if _flag(q.get("previous")):
                raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        data = path.read_bytes()
        # Follow from what was read, not from the size after writing: the kubelet may append while
        # the first chunk is on its way.
        offset = len(data)
        if q.get("tailLines", "").isdigit():
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(q["tailLines"]) :]) if int(q["tailLines"]) else b""
        if q.get("limitBytes", "").isdigit():
            data = data[: int(q["limitBytes"])]
        if not _flag(q.get("follow")):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        uid = pod["metadata"]["uid"]
        try:
            while not self.stopping.is_set():
                await asyncio.sleep(0.2)
                size = path.stat().st_size if path.exists() else offset
                if size < offset:  # truncated (a restarted container's new log): start over
                    offset = 0
                if size > offset:
                    with path.open("rb") as handle:
                        handle.seek(offset)
                        chunk = handle.read(size - offset)
                    offset = size
                    await response.write(chunk)
                    continue
                current = self.cluster.store.get(rt.storage_key, namespace, name)
                if (
                    current is None
                    or current["metadata"].get("uid") != uid
                    or _container_done(current, container)
                ):
                    break
                if request.transport is None or request.transport.is_closing():
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response


def _container_done(pod: Obj, container: str) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container and "terminated" in (status.get("state") or {}):
            return pod.get("spec", {}).get("restartPolicy") == "Never" or pod.get("status", {}).get(
                "phase"
            ) in ("Succeeded", "Failed")
    return False


class ApiServer:
    """The embedded API server, run on its own thread and event loop (see the package docstring)."""

    def __init__(
        self,
        state_dir: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        watch_history: int = 10_000,
        bookmark_interval: float = 5.0,
        log_root: Path | str | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.host = host
        self._requested_port = port
        self.port = 0
        self.watch_history = watch_history
        self.bookmark_interval = bookmark_interval
        self.log_root = Path(log_root) if log_root is not None else self.state_dir
        self.store = Store(watch_history)
        self.registry = Registry()
        self.cluster: Cluster | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._app: App | None = None
        pki_dir = self.state_dir / "pki"
        self.pki = make_pki(pki_dir, (host,) if host not in ("127.0.0.1", "0.0.0.0") else ("127.0.0.1",))

    # -- the public surface ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def ca_path(self) -> Path:
        return self.pki.ca_cert

    @property
    def kubeconfig_path(self) -> Path:
        return self.state_dir / "kubeconfig"

    def kubeconfig(self, context: str = "rtj-local", token: str = "rtj-local-admin") -> Obj:
        ca_data = base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": context, "cluster": {"server": self.url, "certificate-authority-data": ca_data}}
            ],
            "users": [{"name": context, "user": {"token": token}}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
            ],
            "current-context": context,
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: Path | str | None = None, context: str = "rtj-local", token: str = "rtj-local-admin"
    ) -> Path:
        target = Path(path) if path is not None else self.kubeconfig_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(self.kubeconfig(context, token), sort_keys=False))
        target.chmod(0o600)
        return target

    def start(self, timeout: float = 60.0) -> ApiServer:
        if self._thread is not None:
            raise RuntimeError("the API server is already running")
        self._thread = threading.Thread(target=self._run, name="rtj-apiserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the API server did not start in time")
        if self._startup_error is not None:
            raise RuntimeError("the API server failed to start") from self._startup_error
        self.write_kubeconfig()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Callable[[Cluster], Any], timeout: float = 30.0) -> Any:
        """Run ``fn(cluster)`` on the server's loop and return its result (for tests and tools)."""
        if self._loop is None or self.cluster is None:
            raise RuntimeError("the API server is not running")
        cluster = self.cluster

        async def run() -> Any:
            return fn(cluster)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    # -- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced to start() if it happens before ready
            self._startup_error = exc
            self._ready.set()
            if not isinstance(exc, Exception):
                raise
            log.exception("the API server stopped with an error")
        finally:
            self._drain(loop)
            loop.close()

    @staticmethod
    def _drain(loop: asyncio.AbstractEventLoop) -> None:
        """Let closed connections finish (their connection_lost callbacks run on the loop) and cancel
        what is left, so that no socket outlives the loop."""
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0.2))
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(asyncio.sleep(0.05))
            # A TLS connection whose peer vanished without closing waits for the peer's close_notify
            # (up to 30 s) before its socket closes; the loop is going away, so abort it now.
            selector = getattr(loop, "_selector", None)
            for key in list(selector.get_map().values()) if selector is not None else []:
                handle = key.data[0] if isinstance(key.data, tuple) else None
                transport = getattr(getattr(handle, "_callback", None), "__self__", None)
                if isinstance(transport, asyncio.Transport):
                    transport.abort()
            loop.run_until_complete(asyncio.sleep(0))

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.cluster = Cluster(self.store, self.registry)
        self._app = App(
            self.cluster, self.log_root, self.bookmark_interval, lambda: f"{self.host}:{self.port}"
        )
        gc_task = self.cluster.start_background()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.pki.serving_cert, self.pki.serving_key)
        runner = web.AppRunner(self._app.make(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port, ssl_context=context, backlog=1024)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._requested_port
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            self._app.stopping.set()
            gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gc_task
            await runner.cleanup()
