"""A TCP proxy between the operator and the API server that injects network faults (test support).

`ApiProxy` runs an asyncio proxy in a background thread on 127.0.0.1 and forwards bytes both ways
(TLS passes through untouched: the API server's certificate names 127.0.0.1). Faults:

- `stall()`: every connection open now is frozen - no byte is forwarded either way, nothing is
  closed - while new connections pass: what a dead NAT or load-balancer entry does to a
  long-lived connection.
- `outage()`: every connection, open or new, is frozen (new ones are accepted, then black-holed).
- `refuse()`: new connections are closed at once (open ones keep working).
- `partition()`: open connections freeze and new ones are closed at once (the API server's address
  unreachable: nothing hangs in a handshake).
- `reset()`: every open connection is aborted (a TCP reset), once.
- `heal()`: frozen connections are aborted and new ones pass again.

`kubeconfig_via(original, path)` writes a copy of a kubeconfig whose server is the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

CHUNK = 65536


class _Connection:
    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client, self.server = client, server
        self.frozen = False
        self.aborted = asyncio.Event()

    def abort(self) -> None:
        for writer in (self.client, self.server):
            writer.transport.abort()
        self.aborted.set()


class ApiProxy:
    """The proxy: `start()`, point a kubeconfig at `url`, inject faults, `stop()`."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 443
        self.port = 0
        self.connections: list[_Connection] = []
        self.accepted = 0
        self._mode = "pass"  # pass, outage, refuse
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # -- faults (thread-safe: each runs in the proxy's loop) --

    def stall(self) -> None:
        self._in_loop(self._freeze_open)

    def outage(self) -> None:
        def both() -> None:
            self._mode = "outage"
            self._freeze_open()

        self._in_loop(both)

    def refuse(self) -> None:
        self._in_loop(lambda: setattr(self, "_mode", "refuse"))

    def partition(self) -> None:
        def both() -> None:
            self._mode = "refuse"
            self._freeze_open()

        self._in_loop(both)

    def reset(self) -> None:
        self._in_loop(self._abort_open)

    def heal(self) -> None:
        def heal() -> None:
            self._mode = "pass"
            for connection in [c for c in self.connections if c.frozen]:
                connection.abort()

        self._in_loop(heal)

    def _freeze_open(self) -> None:
        for connection in self.connections:
            connection.frozen = True

    def _abort_open(self) -> None:
        for connection in list(self.connections):
            connection.abort()

    def _in_loop(self, action: Any) -> None:
        assert self._loop is not None
        done = threading.Event()

        def run() -> None:
            action()
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- lifecycle --

    def start(self) -> ApiProxy:
        self._thread = threading.Thread(target=self._run, name="api-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._close)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ApiProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(self._server.serve_forever())
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(asyncio.sleep(0.2))  # aborted transports close their sockets
        loop.close()

    def _close(self) -> None:
        self._abort_open()
        if self._server is not None:
            self._server.close()
        for task in asyncio.all_tasks(self._loop):
            if task.get_coro().__name__ == "serve_forever":  # type: ignore[union-attr]
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._mode == "refuse":
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            writer.transport.abort()
            return
        connection = _Connection(writer, upstream_writer)
        connection.frozen = self._mode == "outage"
        self.connections.append(connection)
        try:
            await asyncio.gather(
                self._pump(reader, upstream_writer, connection),
                self._pump(upstream_reader, writer, connection),
            )
        except asyncio.CancelledError:
            pass  # the proxy is stopping
        finally:
            connection.abort()
            self.connections.remove(connection)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        """Forward bytes until either side closes; a frozen connection holds every byte until it is
        aborted (frozen connections never thaw: `heal` aborts them)."""
        while True:
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""
            if not data or writer.is_closing():
                connection.abort()
                return
            if connection.frozen:
                await connection.aborted.wait()
                return
            writer.write(data)
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()


def kubeconfig_via(original: Path, proxy: ApiProxy, path: Path) -> Path:
    """A copy of `original` whose clusters' server is the proxy; returns `path`."""
    config = yaml.safe_load(original.read_text())
    for cluster in config.get("clusters") or []:
        cluster["cluster"]["server"] = proxy.url
    path.write_text(yaml.safe_dump(config))
    return path
