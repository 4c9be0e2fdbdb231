"""The kubelet's HTTPS server: the endpoint the API server proxies ``kubectl logs`` to,
``/containerLogs/<ns>/<pod>/<c>``, and the streaming endpoints of ``kubectl exec``, ``attach`` and
``port-forward`` (``streaming``), which the kubelet adds as ``extra_routes``.

Each simulated node serves HTTPS on its own loopback port (a certificate of the cluster's CA, which
the API server checks through ``--kubelet-certificate-authority``) and advertises it in its Node's
``status.daemonEndpoints.kubeletEndpoint.Port``. Supported query parameters of the log endpoint, as
the kubelet reads them: ``follow``, ``previous``, ``tailLines``, ``limitBytes`` (``timestamps`` and
``sinceSeconds`` are accepted and ignored: the logs are plain files).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path

from aiohttp import web

LogLocator = Callable[[str, str, str, bool], "tuple[Path, Callable[[], bool]] | None"]
"""(namespace, pod, container, previous) -> (its log file, whether it may still grow), or None."""
FOLLOW_POLL_SECONDS = 0.2


def tail_lines(data: bytes, count: int | None) -> bytes:
    """The last ``count`` lines of ``data`` (all of it for None)."""
    if count is None:
        return data
    if count <= 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-count:])


def read_from(path: Path, offset: int) -> bytes:
    """What ``path`` holds after ``offset`` (nothing when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except FileNotFoundError:
        return b""


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


async def listen_on_loopback(runner: web.AppRunner, context: ssl.SSLContext) -> int:
    """Serve ``runner``'s app with HTTPS on a free loopback port; returns the port."""
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    return int(runner.addresses[0][1])


class LogServer:
    """One node's log endpoint; ``start`` returns the port it listens on."""

    def __init__(
        self, locate: LogLocator, cert: Path, key: Path, extra_routes: Iterable[web.RouteDef] = ()
    ) -> None:
        self._locate = locate
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.load_cert_chain(str(cert), str(key))
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        app.router.add_routes(list(extra_routes))
        self._runner = web.AppRunner(app, access_log=None)
        self.port = 0

    async def start(self) -> int:
        self.port = await listen_on_loopback(self._runner, self._ssl)
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        query = request.query
        previous = query.get("previous") == "true"
        found = self._locate(info["namespace"], info["pod"], info["container"], previous)
        if found is None:
            raise web.HTTPNotFound(text=f"container {info['container']!r} of pod {info['pod']!r} not found")
        path, growing = found
        limit = _int(query.get("limitBytes"))
        raw = read_from(path, 0)
        data = tail_lines(raw, _int(query.get("tailLines")))
        if limit is not None:
            data = data[:limit]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        if query.get("follow") == "true" and not previous and (limit is None or len(data) < limit):
            await self._follow(response, path, growing, len(raw))
        await response.write_eof()
        return response

    @staticmethod
    async def _follow(
        response: web.StreamResponse, path: Path, growing: Callable[[], bool], offset: int
    ) -> None:
        """Send what is appended to ``path`` after ``offset`` until the container stops writing it."""
        while True:
            still_running = growing()
            chunk = read_from(path, offset)
            if chunk:
                offset += len(chunk)
                await response.write(chunk)
            elif not still_running:
                return
            await asyncio.sleep(FOLLOW_POLL_SECONDS)
