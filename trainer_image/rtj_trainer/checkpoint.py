"""Per-rank sharded checkpoints with an atomic commit, written asynchronously through NVRx.

Layout under ``$RTJ_CHECKPOINT_DIR`` (a volume every pod of the job mounts)::

    step-000000100/
        rank-00000.pt     one rank's local shards (written by that rank's async writer, fsynced)
        rank-00000.done   written by the rank once its write was finalized: the shard is durable
        ...
        COMMITTED         written last, by rank 0, via rename, once every rank's .done exists

Resume picks the newest directory with ``COMMITTED`` and a matching world size, so a save cut short
by a fault (a missing shard, a torn file without its ``.done``) is never read. Rank 0 prunes all but
the newest ``keep`` committed directories and any partial one older than the newest commit.

Saves copy the state into a staging buffer of preallocated shared-memory CPU tensors before the
writer process sees it: the writer then reads bytes equal to the state at the save call while
training keeps changing the parameters (without a copy NVRx's writer reads live tensors). The
staging buffer is reused, so a save first finalizes the previous one. ``rtj_trainer.nvrx_compat``
holds the writer; ``rtj_trainer.train`` drives the manager once per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import torch

from rtj_trainer.nvrx_compat import AsyncWriter, write_shard_durably

log = logging.getLogger(__name__)

COMMIT_MARKER: Final = "COMMITTED"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_DONE_FILE = re.compile(r"^rank-(\d+)\.done$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def shard_path(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.pt"


def done_path(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.done"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    committed: bool
    world_size: int | None  # from the commit marker; None when not committed
    time: float | None


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Every step directory under ``root``, oldest first."""
    found: list[CheckpointInfo] = []
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        m = _STEP_DIR.match(entry.name)
        if not m or not entry.is_dir():
            continue
        world_size: int | None = None
        when: float | None = None
        committed = False
        marker = entry / COMMIT_MARKER
        if marker.is_file():
            try:
                meta = json.loads(marker.read_text())
                world_size = int(meta["worldSize"])
                when = float(meta["time"])
                committed = True
            except (OSError, ValueError, KeyError):
                committed = False
        found.append(CheckpointInfo(int(m.group(1)), entry, committed, world_size, when))
    return sorted(found, key=lambda c: c.step)


def newest_complete(root: Path, world_size: int | None = None) -> CheckpointInfo | None:
    """The newest committed checkpoint (of ``world_size`` ranks when given)."""
    for info in reversed(list_checkpoints(root)):
        if info.committed and (world_size is None or info.world_size == world_size):
            return info
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` committed checkpoints, and partial ones older than them.

    A partial directory newer than the newest commit may be a save in flight and is left alone.
    """
    infos = list_checkpoints(root)
    committed = [c for c in infos if c.committed]
    if not committed:
        return []
    kept = {c.step for c in committed[-keep:]}
    newest = committed[-1].step
    removed: list[Path] = []
    for info in infos:
        if info.step in kept or (not info.committed and info.step > newest):
            continue
        shutil.rmtree(info.path, ignore_errors=True)
        removed.append(info.path)
    return removed


def try_commit(root: Path, step: int, meta: Mapping[str, Any] | None = None) -> bool:
    """Write the commit marker if every rank's shard of ``step`` is durable. Idempotent."""
    directory = step_dir(root, step)
    if (directory / COMMIT_MARKER).is_file():
        return True
    if not directory.is_dir():
        return False
    world_size: int | None = None
    ranks: set[int] = set()
    for entry in directory.iterdir():
        m = _DONE_FILE.match(entry.name)
        if not m:
            continue
        try:
            done = json.loads(entry.read_text())
            world_size = int(done["worldSize"])
        except (OSError, ValueError, KeyError):
            continue
        ranks.add(int(m.group(1)))
    if world_size is None or ranks != set(range(world_size)):
        return False
    record = {"step": step, "worldSize": world_size, "time": time.time(), **(meta or {})}
    _write_atomically(directory / COMMIT_MARKER, json.dumps(record))
    return True


def commit_ready(root: Path) -> list[int]:
    """Commit any directory whose shards are all durable (a committer died before writing the marker)."""
    return [c.step for c in list_checkpoints(root) if not c.committed and try_commit(root, c.step)]


class StagingBuffer:
    """Preallocated shared-memory CPU tensors, one per state entry, reused by every save."""

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self.bytes = 0

    def stage(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        staged: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            src = tensor.detach()
            buf = self._tensors.get(name)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, device="cpu").share_memory_()  # type: ignore[no-untyped-call]
                self._tensors[name] = buf
            buf.copy_(src)
            staged[name] = buf
        self.bytes = sum(t.numel() * t.element_size() for t in staged.values())
        return staged


@dataclasses.dataclass
class _Pending:
    step: int
    submitted: float


@dataclasses.dataclass
class SaveStats:
    """Timings the progress report and the benchmark read."""

    last_blocking_seconds: float = 0.0
    total_blocking_seconds: float = 0.0
    saves: int = 0
    last_write_seconds: float = 0.0
    writer_deaths: int = 0


class CheckpointManager:
    """One rank's view: save shards, finalize them, and (on rank 0) commit and prune."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        asynchronous: bool = True,
        keep: int = 3,
        keepalive: Callable[[], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.asynchronous = asynchronous
        self.keep = keep
        # Called while a save waits on the writer or the commit: a rank waiting for a slow volume
        # is not hung, and must keep sending heartbeats to ft_launcher.
        self.keepalive = keepalive
        self.stats = SaveStats()
        self._staging = StagingBuffer()
        self._writer: AsyncWriter | None = None
        self._pending: _Pending | None = None
        self._uncommitted: list[int] = []  # rank 0: saved steps awaiting their commit
        self._last_refresh = time.monotonic()
        self.last_committed: CheckpointInfo | None = newest_complete(self.root, world_size)
        self.root.mkdir(parents=True, exist_ok=True)

    def start_writer(self) -> None:
        """Start the async writer process ahead of the first save (spawning it takes seconds).

        The trainer calls this after its first step, so the spawn does not compete with startup.
        """
        if self.asynchronous and self._writer is None:
            self._writer = AsyncWriter(self.rank)
            self._writer.start()

    def refresh(self) -> CheckpointInfo | None:
        """Re-read the newest complete checkpoint from the volume."""
        self.last_committed = newest_complete(self.root, self.world_size)
        return self.last_committed

    @property
    def is_committer(self) -> bool:
        return self.rank == 0

    # -- saving ---------------------------------------------------------------------------------

    def save(self, step: int, tensors: Mapping[str, torch.Tensor], extra: Mapping[str, Any]) -> None:
        """Save this rank's shard of ``step``; returns once the state is copied (async) or written (sync)."""
        started = time.perf_counter()
        # The staging buffer is reused: the previous save must be on disk before it is overwritten.
        self.wait(timeout=None)
        step_dir(self.root, step).mkdir(parents=True, exist_ok=True)
        path = shard_path(self.root, step, self.rank)
        if self.asynchronous:
            payload = self._payload(step, self._staging.stage(tensors), extra)
            if self._writer is None:
                self._writer = AsyncWriter(self.rank)
            self._writer.submit(payload, str(path))
            self._pending = _Pending(step, time.perf_counter())
        else:
            payload = self._payload(step, dict(tensors), extra)
            write_shard_durably(payload, str(path))
            self._mark_done(step)
        blocking = time.perf_counter() - started
        self.stats.last_blocking_seconds = blocking
        self.stats.total_blocking_seconds += blocking
        self.stats.saves += 1
        if self.is_committer:
            self._uncommitted.append(step)

    def _payload(
        self, step: int, tensors: Mapping[str, torch.Tensor], extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        return {
            "step": step,
            "rank": self.rank,
            "worldSize": self.world_size,
            "tensors": dict(tensors),
            "extra": dict(extra),
        }

    def _mark_done(self, step: int) -> None:
        record = {"rank": self.rank, "worldSize": self.world_size, "time": time.time()}
        try:
            _write_atomically(done_path(self.root, step, self.rank), json.dumps(record))
        except FileNotFoundError:
            # The directory was discarded (a resume chose an older checkpoint): nothing to mark.
            log.warning("checkpoint directory of step %d vanished before rank %d marked it", step, self.rank)

    def discard_partials_after(self, step: int) -> list[Path]:
        """Delete uncommitted directories newer than ``step`` (rank 0, when resuming at ``step``)."""
        removed = []
        for info in list_checkpoints(self.root):
            if info.step > step and not info.committed:
                shutil.rmtree(info.path, ignore_errors=True)
                removed.append(info.path)
        self._uncommitted = [s for s in self._uncommitted if s <= step]
        return removed

    def poll(self) -> list[int]:
        """Non-blocking: finalize a finished write, commit what is complete. Returns newly committed steps."""
        if self._pending is None and self._writer is not None and self._writer.pending():
            self._writer.poll()  # the warm-up request
        if self._pending is not None and self._writer is not None:
            if self._writer.poll():
                self.stats.last_write_seconds = time.perf_counter() - self._pending.submitted
                self._mark_done(self._pending.step)
                self._pending = None
            elif not self._writer.writer_alive():
                self._writer_died()
        return self._commit_ready()

    def _writer_died(self) -> None:
        assert self._pending is not None and self._writer is not None
        log.error(
            "checkpoint writer of rank %d died while saving step %d; the save is abandoned",
            self.rank,
            self._pending.step,
        )
        self.stats.writer_deaths += 1
        self._writer.close()
        self._writer = None
        self._pending = None

    def _commit_ready(self) -> list[int]:
        if not self.is_committer:
            # Other ranks learn of commits from the volume, at most every few seconds.
            now = time.monotonic()
            if now - self._last_refresh > 2.0:
                self._last_refresh = now
                self.last_committed = newest_complete(self.root, self.world_size)
            return []
        if not self._uncommitted:
            return []
        committed: list[int] = []
        if self.last_committed is not None:
            # A save abandoned by a dead writer never commits: forget it once a newer one did.
            newest = self.last_committed.step
            self._uncommitted = [s for s in self._uncommitted if s > newest]
        for step in list(self._uncommitted):
            if try_commit(self.root, step):
                self._uncommitted.remove(step)
                committed.append(step)
        if committed:
            self.last_committed = newest_complete(self.root)
            prune(self.root, self.keep)
        return committed

    def wait(self, timeout: float | None) -> bool:
        """Block until this rank's pending write is finalized (or the writer died); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._pending is not None:
            self.poll()
            if self._pending is None:
                break
            if deadline is not None and time.monotonic() > deadline:
                return False
            if self.keepalive is not None:
                self.keepalive()
            time.sleep(0.01)
        return True

    def wait_committed(self, step: int, timeout: float) -> bool:
        """Block until ``step`` is committed: rank 0 commits it once every shard is durable, the
        other ranks watch for the marker."""
        deadline = time.monotonic() + timeout
        self.wait(timeout)
        while True:
            self.poll()
            if (step_dir(self.root, step) / COMMIT_MARKER).is_file():
                return True
            if time.monotonic() > deadline:
                return False
            if self.keepalive is not None:
                self.keepalive()
            time.sleep(0.02)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- loading --------------------------------------------------------------------------------

    def newest_step(self) -> int:
        """The newest complete checkpoint of this world size (-1: none). Ranks must agree on it:
        the trainer takes rank 0's answer, after rank 0 committed what was left complete."""
        if self.is_committer:
            commit_ready(self.root)
        info = newest_complete(self.root, self.world_size)
        return -1 if info is None else info.step

    def load(self, step: int) -> tuple[CheckpointInfo, dict[str, Any]]:
        """This rank's shard of the committed checkpoint ``step``."""
        info = next((c for c in list_checkpoints(self.root) if c.step == step and c.committed), None)
        if info is None or info.world_size != self.world_size:
            raise RuntimeError(f"no complete checkpoint of step {step} for {self.world_size} ranks")
        payload = torch.load(
            shard_path(self.root, info.step, self.rank), map_location="cpu", weights_only=True
        )
        if int(payload["step"]) != info.step or int(payload["rank"]) != self.rank:
            raise RuntimeError(f"checkpoint shard {info.path} does not belong to rank {self.rank}")
        self.last_committed = info
        return info, payload
