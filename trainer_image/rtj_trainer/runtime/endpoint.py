"""The pod's progress endpoint: the pod's progress report and the trainer's Prometheus metrics, over
HTTP, served by ``rtj-launch``, the pod's main process.

The operator reads each worker's progress from ``GET /progress`` on the pod's IP and progress port
(docs/architecture.md, "Progress contract"); Prometheus reads ``GET /metrics``
(``rtj_trainer.runtime.metrics``). Training processes come and go (in-process restarts, ft_launcher's in-job
restarts); ``rtj-launch`` stays, so the endpoint answers through every restart. What it serves is
``rtj_trainer.runtime.launcher_view.merge`` of the last report the library's local rank 0 wrote into the
pod-local file (``rtj_trainer.library.progress.EndpointSink``) and of the launcher's view of the ranks
(``rtj-launch`` keeps it from the rank shims' records): a script that does not use the library still
gets a report (404 only while there is neither). Nothing here talks to the Kubernetes API: the
trainer needs no credentials to report.

Bounded: a small thread per connection (daemon threads, a socket timeout per request), and only the
three paths; every request reads one small local file.
"""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from rtj_contract import progress as progress_contract

from rtj_trainer.runtime import launcher_view, metrics
from rtj_trainer.runtime.launcher_view import LauncherView

log = logging.getLogger(__name__)

PROGRESS_PATH: Final = progress_contract.PATH
METRICS_PATH: Final = progress_contract.METRICS_PATH
HEALTH_PATH: Final = "/healthz"
# A client that neither sends its request nor reads the answer within this is dropped.
REQUEST_TIMEOUT_SECONDS: Final = 5.0


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    endpoint: ProgressEndpoint


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    server_version = "rtj-progress"

    def do_GET(self) -> None:
        endpoint = self.server.endpoint
        path = self.path.partition("?")[0]
        if path == PROGRESS_PATH:
            report = endpoint.report()
            if report is None:
                self._answer(404, "application/json", b'{"error":"no progress report yet"}')
                return
            self._answer(200, "application/json", json.dumps(report, separators=(",", ":")).encode())
            endpoint.served(report)
        elif path == METRICS_PATH:
            text = metrics.exposition(endpoint.report(), time.time())
            self._answer(200, metrics.CONTENT_TYPE, text.encode())
        elif path == HEALTH_PATH:
            self._answer(200, "text/plain; charset=utf-8", b"ok\n")
        else:
            self._answer(404, "text/plain; charset=utf-8", b"not found\n")

    def _answer(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None  # one line per scrape would flood the container's log


def _no_view() -> LauncherView | None:
    return None


class ProgressEndpoint:
    """Serves, on `port` (all addresses; IPv6 when `ipv6`), the library's report file at `path` merged
    with the launcher view that `view` returns (None: no view, the direct and supervisor modes);
    `node_rank` and `launch_start` fill a report made from the view alone."""

    def __init__(
        self,
        path: Path,
        port: int,
        *,
        ipv6: bool = False,
        view: Callable[[], LauncherView | None] = _no_view,
        node_rank: int = 0,
        launch_start: float | None = None,
    ) -> None:
        self.path = path
        self.port = port
        self.ipv6 = ipv6
        self.view = view
        self.node_rank = node_rank
        self.launch_start = time.time() if launch_start is None else launch_start
        self._server: _Server | None = None
        self._served: str | None = None
        self._changed = threading.Condition()

    def start(self) -> bool:
        """Listen; False (and a warning) when the port cannot be bound: progress is advisory, so
        training goes on without it."""
        server_class = _IPv6Server if self.ipv6 else _Server
        try:
            server = server_class(("::" if self.ipv6 else "0.0.0.0", self.port), _Handler)
        except OSError as err:
            log.warning("progress endpoint not served: port %d: %s", self.port, err)
            return False
        server.endpoint = self
        self._server = server
        threading.Thread(target=server.serve_forever, name="rtj-progress-endpoint", daemon=True).start()
        log.info("progress endpoint on port %d (%s, %s)", self.port, PROGRESS_PATH, METRICS_PATH)
        return True

    def library_report(self) -> dict[str, Any] | None:
        """The newest report the library wrote, or None before the first."""
        try:
            loaded = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def report(self, now: float | None = None) -> dict[str, Any] | None:
        """The report to serve now: the library's merged with the launcher view; None when neither
        exists yet."""
        return launcher_view.merge(
            self.library_report(),
            self.view(),
            now=time.time() if now is None else now,
            node_rank=self.node_rank,
            launch_start=self.launch_start,
        )

    def served(self, report: dict[str, Any]) -> None:
        with self._changed:
            self._served = launcher_view.fingerprint(report)
            self._changed.notify_all()

    def wait_delivered(self, timeout: float) -> bool:
        """Wait until the newest report (its content: the time it was made aside) has been read from
        `/progress` (by the operator), at most `timeout` seconds; True when it was, or when there is
        none to deliver."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                current = launcher_view.fingerprint(self.report())
                if current is None or current == self._served:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._server is None:
                    return False
                self._changed.wait(min(left, 0.5))

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
