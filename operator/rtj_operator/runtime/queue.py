"""The operator's work queue: at most one pass per job at a time, bursts coalesced, failures retried.

Every trigger (a kopf handler, a plan's requeue time, a retry) calls `WorkQueue.trigger(key)`. A job's
pass starts after a short debounce; triggers arriving while it runs mark the job dirty and the pass
runs again once it ends. A pass that raises is retried later, with a delay doubling per consecutive
failure, and never stops the other jobs. What a pass does is the `work` callable (`job_pass.run_pass`);
the queue knows nothing of jobs beyond their keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj_operator import metrics
from rtj_operator.progress import RestartOffset

logger = logging.getLogger(__name__)

# Bursts of pod events (N pods created, each going Pending -> Running) are coalesced into one pass.
DEBOUNCE_SECONDS = 0.2
# After a failed pass (API error) the job is tried again this much later, doubling per consecutive
# failure up to the maximum, so that a job that keeps failing does not hammer the API server.
RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0

JobKey = tuple[str, str]  # (namespace, name)


@dataclass
class JobRunner:
    """One job's place in the queue, and what its passes carry from one to the next."""

    dirty: bool = False
    # Whether the next pass asserts the base children (set on job create/update/resume).
    ensure_base: bool = False
    task: asyncio.Task[None] | None = None
    wakeup: asyncio.TimerHandle | None = None
    failures: int = 0
    # In-memory offsets of the trainers' restart counters (see progress.fold_progress).
    offsets: dict[str, RestartOffset] = field(default_factory=dict)
    # When the API server last refused one of the job's children (see decide.admission).
    refused_at: datetime | None = None
    # The status as the API server stored it on this operator's last write: a different status read
    # later was written by someone else (see job_pass.overwritten).
    last_status: dict[str, Any] | None = None
    # What the API server stores if this operator's newest status write landed, until its answer
    # comes: a write whose answer was lost (a timeout, a reset; sent again, it meets a conflict) is
    # still known as this operator's own (see job_pass.overwritten).
    sent_status: dict[str, Any] | None = None
    # The job's children other than pods known to exist (created, or found existing, by this
    # operator): (kind, namespace, name, owner uid) -> when (monotonic). See job_pass.known_child.
    known_children: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    # Whether this operator posted the milestone Events the job's status says are due (see
    # decide.milestones): done once per job per operator start.
    milestones_replayed: bool = False


# A pass over one job; returns the result label for metrics (acted, idle, conflict, gone, ...).
Work = Callable[[JobKey, JobRunner], Awaitable[str]]


class WorkQueue:
    """Per-job serialization of passes: one at a time, re-run while new triggers arrive."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.runners: dict[JobKey, JobRunner] = {}
        self.passes = 0

    async def trigger(self, key: JobKey, *, ensure_base: bool = False, delay: float = 0.0) -> None:
        """Ask for a pass of job `key` (after `delay` seconds); passes never overlap."""
        runner = self.runners.setdefault(key, JobRunner())
        runner.ensure_base = runner.ensure_base or ensure_base
        if delay > 0:
            loop = asyncio.get_running_loop()
            if runner.wakeup is not None:
                runner.wakeup.cancel()
            runner.wakeup = loop.call_later(delay, lambda: asyncio.ensure_future(self.trigger(key)))
            return
        runner.dirty = True
        if runner.task is None or runner.task.done():
            runner.task = asyncio.create_task(self._run(key, runner), name=f"rtj-reconcile-{key[0]}/{key[1]}")

    async def _run(self, key: JobKey, runner: JobRunner) -> None:
        await asyncio.sleep(DEBOUNCE_SECONDS)
        while runner.dirty:
            runner.dirty = False
            started = time.monotonic()
            try:
                result = await self.work(key, runner)
                runner.failures = 0
            except Exception:  # one job's failure must never stop the others: log, count, retry later
                delay = min(MAX_RETRY_SECONDS, RETRY_SECONDS * 2**runner.failures)
                runner.failures += 1
                logger.exception("reconciling %s/%s failed; retrying in %ss", key[0], key[1], delay)
                result = "error"
                await self.trigger(key, delay=delay)
            metrics.RECONCILE_TOTAL.labels(result=result).inc()
            metrics.RECONCILE_DURATION.observe(time.monotonic() - started)
            self.passes += 1

    def forget(self, key: JobKey) -> None:
        """The job is gone: drop its runner and any pending wake-up."""
        runner = self.runners.pop(key, None)
        if runner is not None and runner.wakeup is not None:
            runner.wakeup.cancel()

    def stop(self) -> None:
        """Cancel every pending wake-up and running pass (the operator is stopping)."""
        for runner in self.runners.values():
            if runner.wakeup is not None:
                runner.wakeup.cancel()
            if runner.task is not None and not runner.task.done():
                runner.task.cancel()
