"""Reading the trainers' progress from their pods' progress endpoints (docs/architecture.md, "Progress
contract").

Every served job has a follower (the kopf daemon `handlers.job_progress`, running
`ProgressScraper.follow`): every `ScrapeSettings.interval_seconds` it reads `GET /progress` from each
running worker pod of the job, at the pod's IP (`status.podIP`, set by the kubelet, not by anything in
the pod) and the container port named `progress`; it keeps the newest report per pod uid and asks
the work queue for a pass when one changed. Passes hand the reports to `observe.observe`
(`ProgressScraper.reports`). Nothing here writes to the API server, and the trainers need no
credentials: a pod can only tell the operator about its own progress.

Bounded, so that hundreds of pods never stall the operator: one request per pod per round, at most
`max_concurrent` requests in flight across all jobs, a connect and a total timeout per request, a
cap on the body's size; one job's rounds never overlap, and a slow or unreachable pod delays only its
own job's next round. A failed read keeps the pod's previous report (status stays as it was), is
counted in `rtj_progress_scrapes_total`, and is retried next round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from rtj_contract import env as env_names
from rtj_contract import progress as progress_contract

from rtj_operator import constants, metrics, names
from rtj_operator.progress import ProgressReport, parse_report
from rtj_operator.runtime.queue import JobKey

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScrapeSettings:
    """How the operator reads the progress endpoints."""

    # Seconds between two reads of one job's pods: the trainer's default report interval
    # (RTJ_PROGRESS_INTERVAL_SECONDS), so status follows the trainers within one interval.
    interval_seconds: float = 5.0
    # Seconds to connect to a pod, and for the whole request: an endpoint answers from a local file
    # in milliseconds, so a pod that takes longer is unreachable (a NetworkPolicy, a dead node).
    connect_timeout_seconds: float = 1.0
    timeout_seconds: float = 2.0
    # Requests in flight at once, across every job the operator serves.
    max_concurrent: int = 32
    # Bytes read of one report at most (a report with its 20 events is a few KiB).
    max_bytes: int = 256 * 1024


@dataclass(frozen=True)
class Target:
    """One worker pod's progress endpoint."""

    uid: str
    url: str


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _progress_port(spec: Mapping[str, Any]) -> int:
    """The container port named `progress` (the renderer's), else the contract's default."""
    for container in spec.get("containers") or []:
        for entry in _mapping(container).get("ports") or []:
            port = _mapping(entry)
            number = port.get("containerPort")
            if port.get("name") == names.PROGRESS_PORT_NAME and isinstance(number, int):
                return number
    return progress_contract.PORT


def _env_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The plain values of the pod's containers' environment, by name."""
    return {
        str(var.get("name")): var.get("value")
        for container in spec.get("containers") or []
        for var in map(_mapping, _mapping(container).get("env") or [])
    }


def _spare_trains(spec: Mapping[str, Any]) -> bool:
    """Rendered for spares that take part in the training: Supervisor's reserve ranks, or standby
    nodes of ft_launcher's rendezvous (its most nodes above its active ones)."""
    env = _env_values(spec)
    if env.get(env_names.LAUNCH_MODE) == env_names.LAUNCH_MODE_SUPERVISOR:
        return True
    try:
        return int(env.get(env_names.NNODES_MAX) or 0) > int(env.get(env_names.NNODES) or 0)
    except ValueError:
        return False


def _reports_progress(labels: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Workers do; so do hot spares that take part in the training (Supervisor's reserve ranks,
    ft_launcher's standby nodes: they report once they take over a lost rank's place); spares that
    only hold a node do not."""
    role = labels.get(constants.LABEL_ROLE)
    if role == constants.ROLE_WORKER:
        return True
    return role == constants.ROLE_SPARE and _spare_trains(spec)


def targets(pods: Iterable[Mapping[str, Any]]) -> list[Target]:
    """The endpoints to read: running, not deleting pods that report progress, with an IP (pure)."""
    found = []
    for pod in pods:
        metadata, spec, status = (_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
        labels = _mapping(metadata.get("labels"))
        ip, uid = status.get("podIP"), metadata.get("uid")
        if not _reports_progress(labels, spec) or status.get("phase") != "Running":
            continue
        if metadata.get("deletionTimestamp") or not isinstance(ip, str) or not ip or not isinstance(uid, str):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        found.append(Target(uid=uid, url=f"http://{host}:{_progress_port(spec)}{progress_contract.PATH}"))
    return found


class ProgressScraper:
    """The newest progress report of each pod, by job and pod uid, and the reads that keep them."""

    def __init__(self, settings: ScrapeSettings | None = None) -> None:
        self.settings = settings or ScrapeSettings()
        self._reports: dict[JobKey, dict[str, tuple[bytes, ProgressReport]]] = {}
        self._slots: asyncio.Semaphore | None = None

    def reports(self, key: JobKey) -> dict[str, ProgressReport]:
        """The job's pods' newest reports, by pod uid."""
        return {uid: report for uid, (_, report) in self._reports.get(key, {}).items()}

    def forget(self, key: JobKey) -> None:
        self._reports.pop(key, None)

    async def follow(
        self,
        key: JobKey,
        pods: Callable[[], list[dict[str, Any]]],
        trigger: Callable[[], Awaitable[None]],
    ) -> None:
        """Read the job's endpoints every interval until cancelled; a pass when a report changed."""
        try:
            while True:
                try:
                    if await self.scrape_job(key, pods()):
                        await trigger()
                except Exception:  # one bad round must not end the follower: log, go on next round
                    logger.exception("reading the progress of %s/%s failed", *key)
                await asyncio.sleep(self.settings.interval_seconds)
        finally:
            self.forget(key)

    async def scrape_job(self, key: JobKey, pods: list[dict[str, Any]]) -> bool:
        """Read every target of the job once; True when a report changed."""
        current = {str(_mapping(p.get("metadata")).get("uid")) for p in pods}
        kept = {uid: entry for uid, entry in self._reports.get(key, {}).items() if uid in current}
        found = targets(pods)
        changed = False
        if found:
            started = time.monotonic()
            timeout = aiohttp.ClientTimeout(
                total=self.settings.timeout_seconds, sock_connect=self.settings.connect_timeout_seconds
            )
            connector = aiohttp.TCPConnector(force_close=True, limit=self.settings.max_concurrent)
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                bodies = await asyncio.gather(*(self._read(session, target) for target in found))
            metrics.PROGRESS_SCRAPE_ROUND_DURATION.observe(time.monotonic() - started)
            for target, body in zip(found, bodies, strict=True):
                if body is None or body == kept.get(target.uid, (None,))[0]:
                    continue
                report = parse_report(body.decode("utf-8", errors="replace"))
                if report is None:
                    metrics.PROGRESS_SCRAPES.labels(result="invalid").inc()
                    continue
                kept[target.uid] = (body, report)
                changed = True
        self._reports[key] = kept
        return changed

    async def _read(self, session: aiohttp.ClientSession, target: Target) -> bytes | None:
        """One endpoint's body, or None (counted by why) when it cannot be read."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_concurrent)
        async with self._slots:
            started = time.monotonic()
            result, body = "ok", None
            try:
                async with session.get(target.url) as response:
                    if response.status == 404:
                        result = "no_report"  # the trainer has not written its first report yet
                    elif response.status != 200:
                        result = "error"
                    else:
                        body = await response.content.read(self.settings.max_bytes + 1)
                        if len(body) > self.settings.max_bytes:
                            result, body = "too_large", None
            except TimeoutError:
                result = "timeout"
            except (aiohttp.ClientError, OSError, ValueError):
                result = "error"
            metrics.PROGRESS_SCRAPES.labels(result=result).inc()
            metrics.PROGRESS_SCRAPE_DURATION.observe(time.monotonic() - started)
            return body
