"""The stand-in trainer of hollow pods: a job's world that advances its step at a set rate while every
member is running, checkpoints every so many steps, and starts again from its newest checkpoint when
a member is lost and replaced, as a job restarted from its checkpoint does; and the progress endpoint
each member serves, at its pod IP and the port its container declares as `progress`, in the form the
trainer's runtime serves (the progress contract, version 1).

A world is the set of hollow pods with one owner (the job's pods share their controller): it forms
when as many members run as the pods' ``RTJ_NNODES`` says (1 when absent). Nothing here computes; a
step is time passing. ``RTJ_HOLLOW_STEPS`` in a container's environment ends the world after that
many steps (every member then exits 0); ``RTJ_HOLLOW_STEP_SECONDS`` overrides the settings' rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rtj_contract import env as env_names
from rtj_contract import progress as progress_contract

STEPS_ENV = "RTJ_HOLLOW_STEPS"
STEP_SECONDS_ENV = "RTJ_HOLLOW_STEP_SECONDS"
DEFAULT_CHECKPOINT_EVERY = 50
FINAL_REPORT_WAIT_SECONDS = 15.0


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def container_env(pod: Mapping[str, Any]) -> dict[str, str]:
    """The plain values of the pod's containers' environment, by name (valueFrom is not resolved)."""
    found: dict[str, str] = {}
    for container in pod.get("spec", {}).get("containers") or []:
        for var in container.get("env") or []:
            if isinstance(var.get("value"), str):
                found.setdefault(str(var.get("name")), var["value"])
    return found


def progress_port(pod: Mapping[str, Any]) -> int | None:
    """The container port named `progress`, or None: the pod reports no progress (a store pod)."""
    for container in pod.get("spec", {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == progress_contract.PORT_NAME and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def _positive_int(value: str | None, default: int) -> int:
    try:
        number = int(value or "")
    except ValueError:
        return default
    return number if number > 0 else default


@dataclass(frozen=True)
class WorldShape:
    """What a world's pods say of it in their environment."""

    size: int
    steps: int | None
    step_seconds: float
    checkpoint_every: int

    @classmethod
    def of(cls, pod: Mapping[str, Any], step_seconds: float) -> WorldShape:
        env = container_env(pod)
        try:
            rate = float(env.get(STEP_SECONDS_ENV) or step_seconds)
        except ValueError:
            rate = step_seconds
        steps = _positive_int(env.get(STEPS_ENV), 0)
        return cls(
            size=_positive_int(env.get(env_names.NNODES), 1),
            steps=steps or None,
            step_seconds=rate if rate > 0 else step_seconds,
            checkpoint_every=_positive_int(
                env.get(env_names.CHECKPOINT_INTERVAL_STEPS), DEFAULT_CHECKPOINT_EVERY
            ),
        )


@dataclass
class World:
    """One job's stand-in training: its members (pod uid -> node rank) and where its step stands."""

    shape: WorldShape
    members: dict[str, int] = field(default_factory=dict)
    base_step: int = 0
    formed_at: float | None = None  # wall time the current run of the world began (None: not formed)
    frozen_step: int = 0
    train_start: float | None = None
    restarts: int = 0
    useful_steps: int = 0

    @property
    def formed(self) -> bool:
        return self.formed_at is not None

    def step(self, now: float) -> int:
        if self.formed_at is None:
            return self.frozen_step
        step = self.base_step + int((now - self.formed_at) / self.shape.step_seconds)
        return min(step, self.shape.steps) if self.shape.steps else step

    def checkpoint(self, now: float) -> tuple[int, float] | None:
        """The newest checkpoint's step and time (None before the first one)."""
        every = self.shape.checkpoint_every
        step = self.step(now) // every * every
        if step <= 0:
            return None
        if self.formed_at is None or step <= self.base_step:
            return step, self.train_start or now
        return step, self.formed_at + (step - self.base_step) * self.shape.step_seconds

    def finished(self, now: float) -> bool:
        return self.shape.steps is not None and self.formed and self.step(now) >= self.shape.steps

    def finished_for(self, now: float) -> float:
        """Seconds since the world finished (0 while it has not)."""
        if not self.finished(now) or self.formed_at is None or self.shape.steps is None:
            return 0.0
        return now - (self.formed_at + (self.shape.steps - self.base_step) * self.shape.step_seconds)

    def join(self, uid: str, rank: int, now: float) -> None:
        self.members[uid] = rank
        if not self.formed and len(self.members) >= self.shape.size:
            self._form(now)

    def leave(self, uid: str, now: float) -> None:
        if self.members.pop(uid, None) is None or not self.formed:
            return
        step = self.step(now)
        self.useful_steps = max(self.useful_steps, step)
        checkpoint = self.checkpoint(now)
        self.frozen_step = step
        self.base_step = checkpoint[0] if checkpoint else 0
        self.formed_at = None

    def _form(self, now: float) -> None:
        if self.train_start is None:
            self.train_start = now
        else:
            self.restarts += 1  # every member starts again from the newest checkpoint
        self.formed_at = now

    def report(self, uid: str, now: float) -> dict[str, Any] | None:
        """The member's progress report, or None before the world first formed (a 404, as the
        trainer's runtime answers before its first report)."""
        if self.train_start is None or uid not in self.members:
            return None
        step = self.step(now)
        report: dict[str, Any] = {
            "v": progress_contract.SCHEMA_VERSION,
            "time": _rfc3339(now),
            "nodeRank": self.members[uid],
            "step": step,
            "restarts": {"inProcess": 0, "inJob": self.restarts},
            "stepTimeSeconds": self.shape.step_seconds,
            "usefulStepSeconds": max(self.useful_steps, step) * self.shape.step_seconds,
            "trainStartTime": _rfc3339(self.train_start),
            "finished": self.finished(now),
        }
        checkpoint = self.checkpoint(now)
        if checkpoint is not None:
            report["lastCheckpoint"] = {"step": checkpoint[0], "time": _rfc3339(checkpoint[1])}
        return report


def node_rank(pod: Mapping[str, Any], fallback: int) -> int:
    """The pod's ``RTJ_NODE_RANK``, else ``fallback``."""
    value = container_env(pod).get(env_names.NODE_RANK)
    try:
        rank = int(value) if value is not None else -1
    except ValueError:
        rank = -1
    return rank if rank >= 0 else fallback


class Endpoint:
    """One member's progress endpoint: ``GET /progress`` answers the world's report for the pod.
    ``final_report_read`` tells that a report saying ``finished`` was read: the member exits after
    that (or after ``FINAL_REPORT_WAIT_SECONDS``), so the operator sees the last step."""

    def __init__(self, world: World, uid: str) -> None:
        self.world, self.uid = world, uid
        self._server: asyncio.Server | None = None
        self.final_report_read = False

    async def start(self, ip: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host=ip, port=port, reuse_address=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].decode("latin-1") if request.count(b" ") >= 2 else ""
            report = self.world.report(self.uid, time.time()) if path == progress_contract.PATH else None
            body = json.dumps(report).encode() if report is not None else b"no report yet\n"
            self.final_report_read = self.final_report_read or bool(report and report["finished"])
            status = "200 OK" if report is not None else "404 Not Found"
            head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
