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

The manager is the one entry point (``rtj_trainer.CheckpointManager``); its parts are modules of their
own: ``checkpoint_files`` (the layout on the volume, the commit protocol, the checks of a shard, whose
names this module re-exports), ``checkpoint_staging`` (the staging buffers and the copy into them),
``checkpoint_writes`` (the write in flight in NVRx's writer process, ``nvrx_compat``, and the save
statistics) and ``checkpoint_commits`` (the commits as this rank knows them, and the durability
worker's thread). ``rtj_trainer.reference.train`` and the library's session
(``rtj_trainer.library.session``) drive the manager once per step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rtj_trainer.library import checkpoint_files as files
from rtj_trainer.library.checkpoint_commits import CommitTracker, DurabilityWorker
from rtj_trainer.library.checkpoint_files import (
    COMMIT_MARKER,
    CORRUPT_PREFIX,
    CheckpointInfo,
    commit_ready,
    done_path,
    file_crc32,
    list_checkpoints,
    newest_complete,
    prune,
    shard_path,
    step_dir,
    try_commit,
)
from rtj_trainer.library.checkpoint_reads import CheckpointReader
from rtj_trainer.library.checkpoint_staging import StagingArea, StagingBuffer
from rtj_trainer.library.checkpoint_writes import SaveStats, ShardWrites
from rtj_trainer.library.nvrx_compat import write_shard_durably

__all__ = [
    "COMMIT_MARKER",
    "CORRUPT_PREFIX",
    "CheckpointInfo",
    "CheckpointManager",
    "SaveStats",
    "StagingBuffer",
    "commit_ready",
    "done_path",
    "file_crc32",
    "list_checkpoints",
    "newest_complete",
    "prune",
    "shard_path",
    "step_dir",
    "try_commit",
]


class CheckpointManager(CheckpointReader):
    """One rank's view: save shards, finalize them, and (on rank 0) commit and prune; read them back
    (:class:`CheckpointReader`).

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
        super().__init__(root, rank=rank, world_size=world_size)
        self.asynchronous = asynchronous
        self.keep = keep
        # Called while a save waits on the writer or the commit: a rank waiting for a slow volume
        # is not hung, and must keep sending heartbeats to ft_launcher.
        self.keepalive = keepalive
        self.stats = SaveStats()
        self._staging = StagingArea(background=asynchronous and stage_in_background)
        self._durability = DurabilityWorker(background=asynchronous)
        self._writes = ShardWrites(self.root, rank, world_size, self._durability, self.stats)
        self._commits = CommitTracker(self.root, rank, world_size, keep, self._durability)
        self.root.mkdir(parents=True, exist_ok=True)

    def start_writer(self) -> None:
        """Start the async writer process ahead of the first save (spawning it takes seconds).

        The trainer calls this after its first step, so the spawn does not compete with startup.
        """
        if self.asynchronous:
            self._writes.start()

    def refresh(self) -> CheckpointInfo | None:
        """Re-read the newest complete checkpoint from the volume."""
        return self._commits.refresh()

    @property
    def last_committed(self) -> CheckpointInfo | None:
        """The newest committed checkpoint this rank knows of (None: none yet)."""
        return self._commits.last_committed

    # -- saving ---------------------------------------------------------------------------------

    def ready_to_write(self) -> bool:
        """Whether a durable save now would start writing at once: no write in flight or queued.

        Non-blocking (it polls). One rank's answer; :meth:`ready_to_write_everywhere` agrees on it.
        """
        if not self.asynchronous:
            return True
        self.poll()
        return self._writes.in_flight is None and not self._staging.write_queued()

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
        if not self.asynchronous:
            self._save_now(step, tensors, extra, write=write)
            return
        # The previous copy finished long ago in a training loop (wait_staged() before its update).
        self.wait_staged()
        started = time.perf_counter()
        # A write queued behind the one in flight keeps its buffer: the copy in host memory is then
        # the queued one, and a skipped save does not refresh it.
        buffer = None if not write and self._staging.write_queued() else self._free_buffer(wait=write)
        if buffer is None:
            self.stats.skipped += 1
            self.stats.count_blocking(started)
            return
        if write:
            step_dir(self.root, step).mkdir(parents=True, exist_ok=True)
            self._saved(step)
        else:
            self.stats.skipped += 1
        self._staging.stage(step, buffer, tensors, extra, write=write)
        self._submit_staged()
        self.stats.count_blocking(started)

    def _save_now(
        self, step: int, tensors: Mapping[str, torch.Tensor], extra: Mapping[str, Any], *, write: bool
    ) -> None:
        """A sync save: the shard written, fsynced and marked done before it returns."""
        started = time.perf_counter()
        if write:
            step_dir(self.root, step).mkdir(parents=True, exist_ok=True)
            payload = files.shard_payload(step, self.rank, self.world_size, tensors, extra)
            write_shard_durably(payload, str(shard_path(self.root, step, self.rank)))
            files.mark_done(self.root, step, self.rank, self.world_size)
            self._saved(step)
        else:
            self.stats.skipped += 1
        self.stats.count_blocking(started)

    def wait_staged(self) -> None:
        """Block until the last save's copy of the state is complete, then hand it to the writer.

        Call it before changing the saved tensors in place (the trainer: before ``opt.step()``); it
        returns at once when the copy already finished, as it has when it overlapped a step.
        """
        staged = self._staging.staged
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
        self._commits.saved(step)

    def _free_buffer(self, *, wait: bool) -> StagingBuffer | None:
        """A staging buffer neither the writer reads nor a queued write holds; ``wait``: wait for the
        writer when there is none, otherwise None."""
        while (buffer := self._staging.free_buffer(self._being_written())) is None:
            if not wait:
                return None
            started = time.perf_counter()
            self._wait_for_writer()
            self.stats.total_writer_wait_seconds += time.perf_counter() - started
        return buffer

    def _being_written(self) -> StagingBuffer | None:
        in_flight = self._writes.in_flight
        return None if in_flight is None else in_flight.buffer

    def _wait_for_writer(self) -> None:
        """Until the write in flight is finalized (or its writer died); the queued one then starts."""
        in_flight = self._writes.in_flight
        if in_flight is not None:
            self._poll_until(lambda: self._writes.in_flight is not in_flight, None, interval=0.005)

    def _submit_staged(self) -> None:
        """Hand the staged copy to the writer once it is complete and the writer is free."""
        staged = self._staging.ready_to_write()
        if staged is None or not self._writes.free():
            return
        tensors = staged.copy.result()
        staged.write = False  # handed over; the buffer stays the newest host copy until reused
        self._writes.submit(staged.step, tensors, staged.extra, staged.buffer)

    def discard_partials_after(self, step: int) -> list[Path]:
        """Delete uncommitted directories newer than ``step`` (rank 0, when resuming at ``step``)."""
        return self._commits.discard_partials_after(step)

    def poll(self) -> list[int]:
        """Non-blocking: finalize a finished write, start a queued one, commit what is complete.
        Returns newly committed steps."""
        self._writes.poll()
        self._submit_staged()
        self._writes.marking_done()
        return self._commits.poll()

    def wait(self, timeout: float | None) -> bool:
        """Block until this rank's durable saves are finalized (or their writer died): the copy, the
        queued write and the write in flight. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return not self._writing() or self._poll_until(lambda: not self._writing(), deadline, interval=0.01)

    def _writing(self) -> bool:
        """A durable save of this rank not finished: its copy, its write or its ``.done`` file."""
        return (
            self._writes.in_flight is not None or self._staging.write_queued() or self._writes.marking_done()
        )

    def wait_committed(self, step: int, timeout: float) -> bool:
        """Block until ``step`` is committed: rank 0 commits it once every shard is durable, the
        other ranks watch for the marker."""
        deadline = time.monotonic() + timeout
        self.wait(timeout)
        marker = step_dir(self.root, step) / COMMIT_MARKER
        return self._poll_until(marker.is_file, deadline, interval=0.02)

    def _poll_until(self, done: Callable[[], bool], deadline: float | None, *, interval: float) -> bool:
        """Poll every ``interval`` seconds, calling the keepalive meanwhile, until ``done()`` holds
        after a poll (True) or ``deadline`` (``time.monotonic()``) passed (False)."""
        while True:
            self.poll()
            if done():
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            if self.keepalive is not None:
                self.keepalive()
            time.sleep(interval)

    def close(self) -> None:
        self._staging.close()
        self._durability.close()
        self._commits.close()
        self._writes.close()

    # -- loading --------------------------------------------------------------------------------

    def load(self, step: int) -> tuple[CheckpointInfo, dict[str, Any]]:
        """This rank's shard of the committed checkpoint ``step``, from then on the newest commit known."""
        info, payload = super().load(step)
        self._commits.last_committed = info
        return info, payload
