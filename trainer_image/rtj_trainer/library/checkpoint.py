"""Per-rank sharded checkpoints with an atomic commit, written asynchronously through NVRx.

Layout under ``$RTJ_CHECKPOINT_DIR`` (a volume every pod of the job mounts)::

    step-000000100/
        rank-00000.pt     one rank's local shards (written by that rank's async writer, fsynced)
        rank-00000.done   written by the rank once its write was finalized: the shard is durable;
                          it holds the shard's size and CRC-32, as the rank read it back
        ...
        COMMITTED         written last, by rank 0, via rename, once every rank's .done exists

Resume picks the newest directory with ``COMMITTED`` and a matching world size, so a save cut short
by a fault (a missing shard, a torn file without its ``.done``) is never read. Before a rank loads
its shard, :meth:`CheckpointManager.verify` reads it again against the size and CRC-32 of its
``.done`` (``torch.load`` reads a flipped byte without a word); the ranks agree, and a checkpoint
with a corrupt shard on any rank is set aside by rank 0 (:meth:`CheckpointManager.quarantine`:
renamed ``corrupt-step-...``, kept for a look, never read again) and the ranks fall back to the
one before it. Rank 0 prunes all but the newest ``keep`` committed directories and any partial one
older than the newest commit.

Saves copy the state into a staging buffer of preallocated shared-memory CPU tensors before the
writer process sees it: the writer then reads bytes equal to the state at the save call while
training keeps changing the parameters (without a copy NVRx's writer reads live tensors).

Async saves overlap training three ways:

* the copy runs on a background thread (CUDA state: on a side stream) when the manager is built with
  ``stage_in_background``; the trainer calls ``wait_staged()`` before it next changes the state in
  place (before ``opt.step()``), which blocks only if the copy has not finished;
* two staging buffers: one the writer reads, one for the newest copy. A durable save that finds the
  writer busy waits in the second buffer and is handed over when the writer frees up; only a third
  save while both are taken waits for the writer;
* a save point whose writer is still busy on some rank can be skipped on every rank alike
  (``ready_to_write_everywhere()`` then ``save(write=False)``): the state is copied into host memory
  only, and the durable checkpoint stays at most one write behind. Skipping must be agreed: a step
  commits only once every rank wrote it, so ranks that skipped different steps would commit none.

``rtj_trainer.library.nvrx_compat`` holds the writer; ``rtj_trainer.reference.train`` and the library's
session (``rtj_trainer.library.session``) drive the manager once per step.
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
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

import torch
import torch.distributed as dist

from rtj_trainer.library.nvrx_compat import AsyncWriter, write_shard_durably

log = logging.getLogger(__name__)

COMMIT_MARKER: Final = "COMMITTED"
# A checkpoint with a corrupt shard is renamed with this prefix (CheckpointManager.quarantine).
CORRUPT_PREFIX: Final = "corrupt-"
# How much of a shard is read at a time for its CRC-32.
_CRC_CHUNK_BYTES: Final = 8 << 20
_STEP_DIR = re.compile(r"^step-(\d+)$")
_DONE_FILE = re.compile(r"^rank-(\d+)\.done$")
_T = TypeVar("_T")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def shard_path(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.pt"


def done_path(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.done"


def file_crc32(path: Path) -> tuple[int, int]:
    """(CRC-32, size in bytes) of the file: zlib's, a few GB/s, reading it in chunks."""
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(_CRC_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return crc, size


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


def _cuda_device(state: Mapping[str, torch.Tensor]) -> torch.device | None:
    return next((t.device for t in state.values() if t.is_cuda), None)


class _Stager:
    """Copies the state into a staging buffer, inline or on a background thread.

    torch's copy releases the GIL, so a background copy overlaps the next step's compute. CUDA
    state is copied on a side stream that first waits for the work queued before the save (the
    step that produced the state), so the training stream goes on while the device-to-host copy
    runs.
    """

    def __init__(self, background: bool) -> None:
        self.background = background
        self._pool: ThreadPoolExecutor | None = None  # started by the first copy, again after close()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def start(
        self, buffer: StagingBuffer, state: Mapping[str, torch.Tensor]
    ) -> Future[dict[str, torch.Tensor]]:
        if not self.background:
            done: Future[dict[str, torch.Tensor]] = Future()
            done.set_result(buffer.stage(state))
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtj-ckpt-stage")
        state = dict(state)  # the caller may rebind its entries; the tensors themselves stay
        device = _cuda_device(state)
        if device is None:
            return self._pool.submit(buffer.stage, state)
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        produced = torch.cuda.current_stream(device).record_event()
        return self._pool.submit(self._stage_on_stream, buffer, state, stream, produced)

    @staticmethod
    def _stage_on_stream(
        buffer: StagingBuffer,
        state: Mapping[str, torch.Tensor],
        stream: torch.cuda.Stream,
        produced: torch.cuda.Event,
    ) -> dict[str, torch.Tensor]:
        with torch.cuda.stream(stream):
            stream.wait_event(produced)
            staged = buffer.stage(state)
        stream.synchronize()
        return staged

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class _DurabilityWorker:
    """Durability bookkeeping: ``.done`` files, commits, pruning, re-reading the newest commit.

    Each is fsyncs and directory listings on the shared volume, tens of milliseconds on a busy one:
    for async saves they run on a background thread, in order, so they stay off the training
    thread. Sync saves run them inline, as they write.
    """

    def __init__(self, background: bool) -> None:
        self.background = background
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[Any]] = []

    def run(self, work: Callable[[], _T]) -> Future[_T]:
        if not self.background:
            done: Future[_T] = Future()
            done.set_result(work())
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtj-ckpt-durability")
        future = self._pool.submit(work)
        self._futures = [f for f in self._futures if not f.done()]
        self._futures.append(future)
        return future

    def drain(self) -> None:
        while self._futures:
            self._futures.pop(0).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._futures.clear()


@dataclasses.dataclass(frozen=True)
class _CommitCheck:
    committed: list[int]  # steps this check committed
    newest: CheckpointInfo | None  # the newest complete checkpoint it found; None: not re-read


@dataclasses.dataclass
class _Staged:
    """The newest copy of the state in host memory, and whether it is to be written."""

    step: int
    buffer: StagingBuffer
    copy: Future[dict[str, torch.Tensor]]
    extra: dict[str, Any]
    write: bool  # a durable save of this step was asked for and is not yet with the writer


@dataclasses.dataclass
class _Pending:
    step: int
    submitted: float
    buffer: StagingBuffer


@dataclasses.dataclass
class SaveStats:
    """Timings and counts the progress report and the benchmarks read."""

    last_blocking_seconds: float = 0.0  # the last save() call: waiting for the writer, an inline copy
    total_blocking_seconds: float = 0.0  # every save() call and every wait for a background copy
    saves: int = 0  # durable saves asked for
    skipped: int = 0  # save points that only refreshed the host copy: a writer was still busy
    last_copy_wait_seconds: float = 0.0  # the last wait_staged(): a background copy not finished yet
    total_copy_wait_seconds: float = 0.0
    total_writer_wait_seconds: float = 0.0  # saves waiting for the writer to free a staging buffer
    last_write_seconds: float = 0.0
    writer_deaths: int = 0


class CheckpointManager:
    """One rank's view: save shards, finalize them, and (on rank 0) commit and prune.

    Public as ``rtj_trainer.CheckpointManager`` (docs/library.md), for a script that saves its own
    tensors (``Session.save`` builds on it)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        asynchronous: bool = True,
        keep: int = 3,
        keepalive: Callable[[], None] | None = None,
        stage_in_background: bool = False,
    ) -> None:
        """``stage_in_background``: async saves copy the state on a background thread and return at
        once; the caller must then call :meth:`wait_staged` before it next changes the state in place
        (the trainer: before ``opt.step()``). Off, the copy happens inside :meth:`save`."""
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.asynchronous = asynchronous
        self.keep = keep
        # Called while a save waits on the writer or the commit: a rank waiting for a slow volume
        # is not hung, and must keep sending heartbeats to ft_launcher.
        self.keepalive = keepalive
        self.stats = SaveStats()
        self._stager = _Stager(background=asynchronous and stage_in_background)
        # Two staging buffers at most: one the writer reads, one for the newest copy. The second is
        # allocated by the first save that finds the writer still busy.
        self._buffers: list[StagingBuffer] = [StagingBuffer()]
        self._staged: _Staged | None = None
        self._writer: AsyncWriter | None = None
        self._pending: _Pending | None = None
        self._uncommitted: list[int] = []  # rank 0: saved steps awaiting their commit
        self._last_refresh = time.monotonic()
        self._durability = _DurabilityWorker(background=asynchronous)
        self._commit_check: Future[_CommitCheck] | None = None
        self._done_marks: list[Future[None]] = []  # .done files being written
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

    def ready_to_write(self) -> bool:
        """Whether a durable save now would start writing at once: no write in flight or queued.

        Non-blocking (it polls). One rank's answer; :meth:`ready_to_write_everywhere` agrees on it.
        """
        if not self.asynchronous:
            return True
        self.poll()
        return self._pending is None and not self._write_queued()

    def ready_to_write_everywhere(self, device: torch.device) -> bool:
        """:meth:`ready_to_write` on every rank (a collective: every rank calls it at the same step).

        Pass the result to :meth:`save` as ``write``: every rank then writes, or skips, the same
        steps, so the steps written are complete on every rank and commit. Sync saves are always
        ready: no collective (the mode is the same on every rank).
        """
        if not self.asynchronous:
            return True
        flag = torch.tensor([1 if self.ready_to_write() else 0], dtype=torch.int32, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return int(flag[0]) == 1

    def save(
        self, step: int, tensors: Mapping[str, torch.Tensor], extra: Mapping[str, Any], *, write: bool = True
    ) -> None:
        """Save this rank's shard of ``step``.

        Sync: written before it returns. Async: the state is copied into a staging buffer (inside
        this call, or on a background thread when ``stage_in_background``) and written by the writer
        process; a write still in flight delays it, and only a save that finds one write in flight
        and another queued waits, for the first. ``write=False`` (a writer somewhere is still busy:
        :meth:`ready_to_write_everywhere`) only refreshes the copy in host memory and counts the
        save as skipped: the durable checkpoint stays at most one write behind the save points.
        """
        started = time.perf_counter()
        if not self.asynchronous:
            if write:
                step_dir(self.root, step).mkdir(parents=True, exist_ok=True)
                write_shard_durably(
                    self._payload(step, dict(tensors), extra), str(shard_path(self.root, step, self.rank))
                )
                self._mark_done(step)
                self._saved(step)
            else:
                self.stats.skipped += 1
            self._count_blocking(started)
            return
        # The previous copy finished long ago in a training loop (wait_staged() before its update).
        self.wait_staged()
        started = time.perf_counter()
        # A write queued behind the one in flight keeps its buffer: the copy in host memory is then
        # the queued one, and a skipped save does not refresh it.
        buffer = None if not write and self._write_queued() else self._free_buffer(wait=write)
        if buffer is None:
            self.stats.skipped += 1
            self._count_blocking(started)
            return
        if write:
            step_dir(self.root, step).mkdir(parents=True, exist_ok=True)
            self._saved(step)
        else:
            self.stats.skipped += 1
        self._staged = _Staged(step, buffer, self._stager.start(buffer, tensors), dict(extra), write)
        self._submit_staged()
        self._count_blocking(started)

    def wait_staged(self) -> None:
        """Block until the last save's copy of the state is complete, then hand it to the writer.

        Call it before changing the saved tensors in place (the trainer: before ``opt.step()``); it
        returns at once when the copy already finished, as it has when it overlapped a step.
        """
        staged = self._staged
        if staged is None:
            return
        started = time.perf_counter()
        copy_wait = 0.0
        if not staged.copy.done():
            staged.copy.result()
            copy_wait = time.perf_counter() - started
        self._submit_staged()
        self.stats.last_copy_wait_seconds = copy_wait
        self.stats.total_copy_wait_seconds += copy_wait
        self.stats.total_blocking_seconds += time.perf_counter() - started

    def _saved(self, step: int) -> None:
        self.stats.saves += 1
        if self.is_committer:
            self._uncommitted.append(step)

    def _count_blocking(self, started: float) -> None:
        blocking = time.perf_counter() - started
        self.stats.last_blocking_seconds = blocking
        self.stats.total_blocking_seconds += blocking

    def _write_queued(self) -> bool:
        return self._staged is not None and self._staged.write

    def _free_buffer(self, *, wait: bool) -> StagingBuffer | None:
        """A staging buffer neither the writer reads nor a queued write holds; ``wait``: wait for the
        writer when there is none, otherwise None."""
        while True:
            taken = {id(self._pending.buffer)} if self._pending is not None else set()
            if self._write_queued():
                assert self._staged is not None
                taken.add(id(self._staged.buffer))
            for buffer in self._buffers:
                if id(buffer) not in taken:
                    return buffer
            if len(self._buffers) < 2:
                self._buffers.append(StagingBuffer())
                continue
            if not wait:
                return None
            started = time.perf_counter()
            self._wait_for_writer()
            self.stats.total_writer_wait_seconds += time.perf_counter() - started

    def _wait_for_writer(self) -> None:
        """Until the write in flight is finalized (or its writer died); the queued one then starts."""
        in_flight = self._pending
        while in_flight is not None and self._pending is in_flight:
            self.poll()
            if self._pending is not in_flight:
                break
            if self.keepalive is not None:
                self.keepalive()
            time.sleep(0.005)

    def _submit_staged(self) -> None:
        """Hand the staged copy to the writer once it is complete and the writer is free."""
        staged = self._staged
        if staged is None or not staged.write or not staged.copy.done():
            return
        if self._pending is not None:
            self._poll_writer()
            if self._pending is not None:
                return
        tensors = staged.copy.result()
        staged.write = False  # handed over; the buffer stays the newest host copy until reused
        if self._writer is None:
            self._writer = AsyncWriter(self.rank)
        payload = self._payload(staged.step, tensors, staged.extra)
        self._writer.submit(payload, str(shard_path(self.root, staged.step, self.rank)))
        self._pending = _Pending(staged.step, time.perf_counter(), staged.buffer)

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
        record: dict[str, Any] = {"rank": self.rank, "worldSize": self.world_size, "time": time.time()}
        try:
            record["crc32"], record["bytes"] = file_crc32(shard_path(self.root, step, self.rank))
            _write_atomically(done_path(self.root, step, self.rank), json.dumps(record))
        except FileNotFoundError:
            # The directory was discarded (a resume chose an older checkpoint): nothing to mark.
            log.warning("checkpoint directory of step %d vanished before rank %d marked it", step, self.rank)

    def discard_partials_after(self, step: int) -> list[Path]:
        """Delete uncommitted directories newer than ``step`` (rank 0, when resuming at ``step``)."""
        self._durability.drain()  # no commit check may be listing a directory deleted below
        self._collect_commit_check()
        removed = []
        for info in list_checkpoints(self.root):
            if info.step > step and not info.committed:
                shutil.rmtree(info.path, ignore_errors=True)
                removed.append(info.path)
        self._uncommitted = [s for s in self._uncommitted if s <= step]
        return removed

    def poll(self) -> list[int]:
        """Non-blocking: finalize a finished write, start a queued one, commit what is complete.
        Returns newly committed steps."""
        self._poll_writer()
        self._submit_staged()
        self._marking_done()
        return self._commit_ready()

    def _poll_writer(self) -> None:
        if self._pending is None and self._writer is not None and self._writer.pending():
            self._writer.poll()  # the warm-up request
        if self._pending is not None and self._writer is not None:
            if self._writer.poll():
                self.stats.last_write_seconds = time.perf_counter() - self._pending.submitted
                written = self._pending.step
                self._done_marks.append(self._durability.run(lambda: self._mark_done(written)))
                self._pending = None
            elif not self._writer.writer_alive():
                self._writer_died()

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
        """Collect the last commit check, start the next one (rank 0: while saves await their commit;
        the other ranks: re-read the newest commit at most every few seconds)."""
        committed = self._collect_commit_check()
        if self._commit_check is not None:
            return committed
        if self.is_committer:
            if self.last_committed is not None:
                # A save abandoned by a dead writer never commits: forget it once a newer one did.
                newest = self.last_committed.step
                self._uncommitted = [s for s in self._uncommitted if s > newest]
            if not self._uncommitted:
                return committed
            steps = list(self._uncommitted)
            self._commit_check = self._durability.run(lambda: self._commit_steps(steps))
        else:
            now = time.monotonic()
            if now - self._last_refresh <= 2.0:
                return committed
            self._last_refresh = now
            self._commit_check = self._durability.run(
                lambda: _CommitCheck([], newest_complete(self.root, self.world_size))
            )
        return committed + self._collect_commit_check()

    def _commit_steps(self, steps: list[int]) -> _CommitCheck:
        """Rank 0, off the training thread: commit what is complete, then prune."""
        committed = []
        for step in steps:
            try:
                if try_commit(self.root, step):
                    committed.append(step)
            except OSError:
                continue  # the directory was discarded meanwhile (a resume chose an older step)
        if not committed:
            return _CommitCheck([], None)
        newest = newest_complete(self.root)
        prune(self.root, self.keep)
        return _CommitCheck(committed, newest)

    def _collect_commit_check(self) -> list[int]:
        check = self._commit_check
        if check is None or not check.done():
            return []
        self._commit_check = None
        result = check.result()
        self._uncommitted = [s for s in self._uncommitted if s not in result.committed]
        if result.newest is not None:
            self.last_committed = result.newest
        return result.committed

    def wait(self, timeout: float | None) -> bool:
        """Block until this rank's durable saves are finalized (or their writer died): the copy, the
        queued write and the write in flight. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._writing():
            self.poll()
            if not self._writing():
                break
            if deadline is not None and time.monotonic() > deadline:
                return False
            if self.keepalive is not None:
                self.keepalive()
            time.sleep(0.01)
        return True

    def _writing(self) -> bool:
        """A durable save of this rank not finished: its copy, its write or its ``.done`` file."""
        return self._pending is not None or self._write_queued() or self._marking_done()

    def _marking_done(self) -> bool:
        for mark in [m for m in self._done_marks if m.done()]:
            self._done_marks.remove(mark)
            mark.result()  # a .done file that could not be written fails the caller
        return bool(self._done_marks)

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
        self._stager.close()
        self._durability.close()
        self._commit_check = None
        self._done_marks.clear()
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

    def newest_verified_step(
        self, agree_on_newest: Callable[[], int], on_every_rank: Callable[[bool], bool]
    ) -> int:
        """The newest checkpoint the ranks agree on whose every rank's shard verifies (-1: none).

        ``agree_on_newest`` (a collective): the newest complete step, the same on every rank;
        ``on_every_rank`` (a collective): whether a flag holds on every rank. A checkpoint with a
        corrupt shard on any rank is set aside by the committer (:meth:`quarantine`) and the ranks
        agree again, on the one before it.
        """
        step = agree_on_newest()
        while step >= 0:
            problem = self.verify(step)
            if problem is not None:
                log.error("%s: falling back to the checkpoint before it", problem)
            if on_every_rank(problem is None):
                return step
            if self.is_committer:
                self.quarantine(step)
            step = agree_on_newest()
        return step

    def verify(self, step: int) -> str | None:
        """Why this rank's shard of ``step`` cannot be trusted, or None: its size and CRC-32 now,
        against what its ``.done`` recorded when it was written (a ``.done`` without them, written
        by a library before 0.4.0, is trusted)."""
        shard = shard_path(self.root, step, self.rank)
        try:
            record = json.loads(done_path(self.root, step, self.rank).read_text())
            if "crc32" not in record:
                return None
            crc, size = file_crc32(shard)
        except (OSError, ValueError) as error:
            return f"checkpoint shard {shard} of step {step} cannot be read: {error}"
        if (crc, size) != (record["crc32"], record.get("bytes")):
            return (
                f"checkpoint shard {shard} of step {step} is corrupt: CRC-32 {crc:08x} over {size} bytes, "
                f"written as {int(record['crc32']):08x} over {record.get('bytes')} bytes"
            )
        return None

    def quarantine(self, step: int) -> Path | None:
        """Set the checkpoint of ``step`` aside (rank 0, when a rank found its shard corrupt): renamed
        ``corrupt-step-...`` in place, no longer a checkpoint to resume from or to prune."""
        source = step_dir(self.root, step)
        target = source.with_name(f"{CORRUPT_PREFIX}{source.name}-{int(time.time())}")
        try:
            source.rename(target)
        except FileNotFoundError:
            return None
        _fsync_dir(self.root)
        return target

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
