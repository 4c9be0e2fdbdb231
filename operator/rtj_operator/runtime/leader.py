"""Leader election between operator replicas: one coordination.k8s.io/v1 Lease, renewed in a loop.

`main.run_operator` waits in `LeaderElector.acquire` before it starts kopf, so a standby replica
watches nothing and handles no job; once it holds the Lease it starts kopf and `keep` renews the
Lease every `retry_period_seconds`. The rules are those of client-go's leader election:

- A Lease held by another replica is taken over only once it went unchanged for its
  `leaseDurationSeconds`, measured on this replica's own monotonic clock from when it saw the
  change (no comparison of wall clocks between machines).
- Fencing: the leader acts only while its last successful renewal was sent less than
  `renew_deadline_seconds` ago (`holds`); every pass checks it before each write
  (`job_pass`), and when a renewal cannot succeed within the deadline `keep` returns and the operator
  stops (the process exits and restarts as a standby). The deadline is shorter than the lease
  duration, so the old leader has stopped writing before a standby may take the Lease over; the
  difference is the margin for a write already in flight.
- A leader that stops cleanly releases the Lease (holder cleared), and a standby takes it over at
  its next try instead of waiting for the lease to run out.

Hand-over after a leader is killed: at most lease duration + retry period + kopf's start (listing
the jobs, pods and nodes); about 10-14 s with the defaults.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes

from rtj_operator.runtime import kube

logger = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "rtj-operator-leader"


def default_identity() -> str:
    """The pod's name (the hostname in a pod) and a random suffix: unique per process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class LeaderElectionSettings:
    """Where the Lease lives and its timings (seconds)."""

    namespace: str
    name: str = DEFAULT_LEASE_NAME
    identity: str = field(default_factory=default_identity)
    # A Lease not renewed for this long may be taken over by a standby.
    lease_duration_seconds: int = 10
    # The leader stops acting when it could not renew for this long (< lease duration).
    renew_deadline_seconds: float = 7.0
    # How often the leader renews and a standby tries to acquire.
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_seconds} / {self.renew_deadline_seconds} / {self.lease_duration_seconds}"
            )

    @property
    def call_seconds(self) -> float:
        """The read timeout of one Lease call: a few fit into the renew deadline."""
        return max(1.0, self.renew_deadline_seconds / 3)


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's side of the election over the Lease `settings.namespace/settings.name`."""

    def __init__(
        self,
        client: kube.ApiTransport,
        settings: LeaderElectionSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube, self.settings, self._clock, self._wall = client, settings, clock, wall
        # The other holder's record as last seen, and when (monotonic) it was first seen so.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        # When the last successful acquire/renew was sent (monotonic); None while not leading.
        self._renewed_at: float | None = None
        self._lease: dict[str, Any] | None = None
        self._lost = False
        self.acquired_at: float | None = None

    def holds(self) -> bool:
        """Whether this replica may act: it renewed within the renew deadline and never lost the Lease."""
        if self._lost or self._renewed_at is None:
            return False
        return self._clock() - self._renewed_at < self.settings.renew_deadline_seconds

    def holder(self) -> str | None:
        """The holder as last seen (this replica's identity while it leads)."""
        if self.holds():
            return self.settings.identity
        return None if self._observed is None else self._observed[0]

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try every retry period until this replica holds the Lease (True) or `stop` is set (False)."""
        logger.info(
            "standing by for the Lease %s/%s as %s",
            self.settings.namespace,
            self.settings.name,
            self.settings.identity,
        )
        while not stop.is_set():
            if await self._attempt():
                self.acquired_at = self._clock()
                logger.info("acquired the Lease %s/%s: leading", self.settings.namespace, self.settings.name)
                return True
            await _sleep_unless(stop, self.settings.retry_period_seconds)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew every retry period until `stop` is set (then release) or a renewal cannot succeed
        within the renew deadline (then return: the Lease is lost and the caller stops acting)."""
        while not stop.is_set():
            assert self._renewed_at is not None
            remaining = self._renewed_at + self.settings.renew_deadline_seconds - self._clock()
            attempt = asyncio.ensure_future(self._attempt())
            try:
                renewed = await asyncio.wait_for(asyncio.shield(attempt), timeout=max(0.0, remaining))
            except TimeoutError:
                renewed = False
            if not self.holds() and not renewed:
                self._lost = True
                logger.error(
                    "could not renew the Lease %s/%s within %.0f s: %s is no longer leading",
                    self.settings.namespace,
                    self.settings.name,
                    self.settings.renew_deadline_seconds,
                    self.settings.identity,
                )
                return
            await _sleep_unless(stop, self.settings.retry_period_seconds)
        await self.release()

    async def release(self) -> None:
        """Hand the Lease over now (holder cleared), if this replica still holds it."""
        if not self.holds() or self._lease is None:
            return
        lease = self._lease
        now = _micro_time(self._wall())
        lease["spec"] = {
            **lease["spec"],
            "holderIdentity": None,
            "leaseDurationSeconds": 1,
            "renewTime": now,
            "acquireTime": now,
        }
        self._lost = True
        try:
            await asyncio.to_thread(_replace_lease, self.kube, lease, read_seconds=self.settings.call_seconds)
            logger.info("released the Lease %s/%s", self.settings.namespace, self.settings.name)
        except Exception as error:
            logger.warning("could not release the Lease: %r", error)

    async def _attempt(self) -> bool:
        try:
            return await asyncio.to_thread(self._try_acquire_or_renew)
        except Exception as error:
            logger.warning(
                "Lease %s/%s (as %s): %r",
                self.settings.namespace,
                self.settings.name,
                self.settings.identity,
                error,
            )
            return False

    def _try_acquire_or_renew(self) -> bool:
        sent = self._clock()
        seconds = self.settings.call_seconds
        if self.holds() and self._lease is not None:
            # The fast path of a leader: update the Lease as last written, no read first.
            renewed = _replace_lease(
                self.kube, self._renewed(self._lease, keep_acquired=True), read_seconds=seconds
            )
            if renewed is not None:
                return self._won(renewed, sent)
        lease = _get_lease(self.kube, self.settings.namespace, self.settings.name, read_seconds=seconds)
        if lease is None:
            created = _create_lease(self.kube, self._new_lease(), read_seconds=seconds)
            return created is not None and self._won(created, sent)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        mine = holder == self.settings.identity
        record = (
            holder,
            spec.get("renewTime"),
            spec.get("leaseTransitions"),
            spec.get("leaseDurationSeconds"),
        )
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_seconds)
        if holder and not mine and self._clock() - self._observed_at < duration:
            return False  # held by another replica that renewed within its lease duration
        replaced = _replace_lease(self.kube, self._renewed(lease, keep_acquired=mine), read_seconds=seconds)
        return replaced is not None and self._won(replaced, sent)

    def _won(self, lease: dict[str, Any], sent: float) -> bool:
        if self._lost:
            return False  # a late answer after the deadline passed: leadership stays lost
        self._lease, self._renewed_at = lease, sent
        return True

    def _new_lease(self) -> dict[str, Any]:
        now = _micro_time(self._wall())
        return {
            "apiVersion": f"{kube.COORDINATION_GROUP}/v1",
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": {
                "holderIdentity": self.settings.identity,
                "leaseDurationSeconds": self.settings.lease_duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }

    def _renewed(self, lease: dict[str, Any], *, keep_acquired: bool) -> dict[str, Any]:
        """The Lease with this replica as holder and renewTime now (resourceVersion kept: an
        optimistic update, so two standbys cannot both take the same expired Lease)."""
        spec = dict(lease.get("spec") or {})
        now = _micro_time(self._wall())
        transitions = int(spec.get("leaseTransitions") or 0)
        spec.update(
            holderIdentity=self.settings.identity,
            leaseDurationSeconds=self.settings.lease_duration_seconds,
            renewTime=now,
            acquireTime=spec.get("acquireTime") if keep_acquired else now,
            leaseTransitions=transitions if keep_acquired else transitions + 1,
        )
        return {**lease, "spec": spec}


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass


# -- the Lease calls: one try each (the election loop tries again) --

_LEASES = kube.RESOURCES["Lease"]


def _get_lease(
    client: kube.ApiTransport, namespace: str, name: str, *, read_seconds: float
) -> dict[str, Any] | None:
    try:
        return client.request("GET", _LEASES.path(namespace, name), read_seconds=read_seconds, attempts=1)
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return None
        raise


def _create_lease(
    client: kube.ApiTransport, lease: dict[str, Any], *, read_seconds: float
) -> dict[str, Any] | None:
    """The Lease as created, or None when another replica created it first (409)."""
    path = _LEASES.path(lease["metadata"]["namespace"])
    try:
        return client.request("POST", path, body=lease, read_seconds=read_seconds, attempts=1)
    except kubernetes.client.ApiException as error:
        if error.status == 409:
            return None
        raise


def _replace_lease(
    client: kube.ApiTransport, lease: dict[str, Any], *, read_seconds: float
) -> dict[str, Any] | None:
    """The Lease as replaced, or None when it changed since it was read (409: another replica wrote it)."""
    path = _LEASES.path(lease["metadata"]["namespace"], lease["metadata"]["name"])
    try:
        return client.request("PUT", path, body=lease, read_seconds=read_seconds, attempts=1)
    except kubernetes.client.ApiException as error:
        if error.status == 409:
            return None
        raise
