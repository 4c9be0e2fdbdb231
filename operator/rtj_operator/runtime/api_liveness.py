"""Whether the operator still sees the API server: the liveness endpoint, and the exit on credentials
that no longer work.

Every call of the operator's own client (`kube.Kube`) reports its outcome here, and so does every
watch event kopf delivers (`handlers`, `watch_event`); `watch_api` makes a cheap call (GET /version)
whenever nothing else was heard for a few seconds, so that a quiet cluster is not mistaken for a
blind operator, and drops the client's pooled connections when the watches have gone silent (kopf
re-makes a silent watch on a new connection; the reads of the pass that follows must not ride a
pooled connection that froze with it). `serve_health` answers the kubelet's probes: 200 while some
API call or watch event succeeded within `LivenessSettings.stale_after_seconds`, 503 after. A TLS
certificate the client cannot verify or a 401 Unauthorized, `fatal_failures` times in a row, makes
`watch_api` stop the operator (the process exits non-zero and the kubelet restarts it with the
current mounted token and CA): retrying the same credentials forever only fills the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import aiohttp.web
import kubernetes
import urllib3

from rtj_operator import metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LivenessSettings:
    """How the operator judges its own view of the API server (seconds unless named otherwise)."""

    # Liveness fails when no API call and no watch event succeeded for this long.
    stale_after_seconds: float = 60.0
    # A GET /version is made when nothing was heard for this long (also its read timeout).
    ping_interval_seconds: float = 5.0
    # Consecutive TLS-verification or 401 failures after which the process exits.
    fatal_failures: int = 5

    def __post_init__(self) -> None:
        if self.stale_after_seconds <= self.ping_interval_seconds:
            raise ValueError("stale_after_seconds must be longer than ping_interval_seconds")
        if self.fatal_failures < 1:
            raise ValueError("fatal_failures must be at least 1")


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error, its causes and contexts, and urllib3's wrapped `reason`s."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for linked in (current.__cause__, current.__context__, getattr(current, "reason", None)):
            if isinstance(linked, BaseException):
                todo.append(linked)


def is_credential_failure(error: BaseException) -> bool:
    """A failure that trying again with the same credentials cannot fix: the API server's certificate
    does not verify (a rotated CA), or the server answered 401 Unauthorized (a revoked token)."""
    for current in _chain(error):
        if isinstance(current, kubernetes.client.ApiException) and current.status == 401:
            return True
        if isinstance(current, (ssl.SSLCertVerificationError, aiohttp.ClientConnectorCertificateError)):
            return True
        text = str(current)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            return True
    return False


def failure_class(error: BaseException) -> str:
    """The class of a failed API call, as `rtj_api_errors_total` labels it: credentials (see
    `is_credential_failure`), throttled (429), server (5xx), refused (another status), timeout or
    connection (no answer)."""
    if is_credential_failure(error):
        return "credentials"
    for current in _chain(error):
        if isinstance(current, kubernetes.client.ApiException) and current.status:
            status = int(current.status)
            return "throttled" if status == 429 else "server" if status >= 500 else "refused"
    if any(isinstance(c, TimeoutError | urllib3.exceptions.TimeoutError) for c in _chain(error)):
        return "timeout"
    return "connection"


class ApiLiveness:
    """The last time the API server answered, and the run of credential failures since."""

    def __init__(self, settings: LivenessSettings | None = None, clock: Callable[[], float] = time.monotonic):
        self.settings = settings or LivenessSettings()
        self._clock = clock
        self._lock = threading.Lock()  # the client reports from worker threads
        self.last_success = clock()
        self.last_watch_event: float | None = None  # None until kopf delivers one
        self.credential_failures = 0
        self.last_failure = ""

    def succeeded(self) -> None:
        with self._lock:
            self.last_success = self._clock()
            self.credential_failures = 0

    def watch_event(self) -> None:
        """kopf delivered a watch event (or a listed object)."""
        with self._lock:
            self.last_watch_event = self.last_success = self._clock()
            self.credential_failures = 0

    def watches_silent_for(self) -> float:
        """Seconds since the last watch event (0 before the first)."""
        return 0.0 if self.last_watch_event is None else self._clock() - self.last_watch_event

    def failed(self, error: BaseException) -> None:
        metrics.count_api_error(failure_class(error))
        with self._lock:
            self.last_failure = f"{type(error).__name__}: {error}"
            if is_credential_failure(error):
                self.credential_failures += 1

    def silent_seconds(self) -> float:
        """Seconds since the API server last answered (a call or a watch event)."""
        return self._clock() - self.last_success

    def healthy(self) -> bool:
        return self.silent_seconds() <= self.settings.stale_after_seconds

    def hopeless(self) -> bool:
        """The credentials failed `fatal_failures` times in a row: only a restart can help."""
        return self.credential_failures >= self.settings.fatal_failures

    def report(self) -> dict[str, Any]:
        return {
            "apiSilentSeconds": round(self.silent_seconds(), 1),
            "staleAfterSeconds": self.settings.stale_after_seconds,
            "credentialFailures": self.credential_failures,
            "lastFailure": self.last_failure,
        }


async def watch_api(
    record: ApiLiveness,
    ping: Callable[[], object],
    stop: asyncio.Event,
    *,
    drop_connections: Callable[[], None] | None = None,
    watch_silence_seconds: float | None = None,
) -> None:
    """Ping the API server whenever it has been silent for a ping interval, and drop the pooled
    connections once per silence of the watches longer than `watch_silence_seconds`; return when
    `stop` is set or when the credentials are hopeless (the caller then stops the operator)."""
    interval = record.settings.ping_interval_seconds
    dropped_for: float | None = None  # the watch event whose silence the pool was dropped for
    while not stop.is_set():
        silent_watches = (
            watch_silence_seconds is not None and record.watches_silent_for() >= watch_silence_seconds
        )
        if drop_connections is not None and silent_watches and dropped_for != record.last_watch_event:
            dropped_for = record.last_watch_event
            logger.info(
                "no watch event for %.0f s: dropping pooled API connections", record.watches_silent_for()
            )
            drop_connections()
        if record.silent_seconds() >= interval:
            try:
                await asyncio.to_thread(ping)
            except Exception as error:
                logger.warning("the API server did not answer a health check: %r", error)
        if record.hopeless():
            logger.error(
                "%d API calls in a row failed on the credentials (last: %s): exiting to restart with "
                "fresh ones",
                record.credential_failures,
                record.last_failure,
            )
            return
        try:
            await asyncio.wait_for(stop.wait(), timeout=min(interval, watch_silence_seconds or interval))
        except TimeoutError:
            pass


async def serve_health(url: str, report: Callable[[], tuple[bool, dict[str, Any]]]) -> aiohttp.web.AppRunner:
    """Serve `report` at `url` (e.g. http://0.0.0.0:8080/healthz): 200 when healthy, else 503, with
    the report as JSON. The caller cleans the returned runner up."""
    parts = urlsplit(url)

    async def probe(_: aiohttp.web.Request) -> aiohttp.web.Response:
        ok, body = report()
        return aiohttp.web.Response(
            status=200 if ok else 503, text=json.dumps(body), content_type="application/json"
        )

    app = aiohttp.web.Application()
    app.router.add_get(parts.path or "/", probe)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, parts.hostname or "0.0.0.0", parts.port or 80)
    await site.start()
    return runner
