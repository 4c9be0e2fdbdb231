"""One rank's async shard writes: the write in flight in NVRx's writer process, and its ``.done`` file.

The checkpoint manager (``rtj_trainer.library.checkpoint``) hands this module a staged copy
(``checkpoint_staging``) once the writer is free; the write goes to the writer process
(``nvrx_compat.AsyncWriter``), one at a time. Polling notices a finalized write, whose ``.done`` file
(``checkpoint_files.mark_done``) the durability worker (``checkpoint_commits``) then writes off the
training thread, or a writer that died, whose save is abandoned. ``SaveStats`` holds the timings and
counts of the whole save path, which the manager exposes as ``stats``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from rtj_trainer.library import checkpoint_files as files
from rtj_trainer.library.checkpoint_commits import DurabilityWorker
from rtj_trainer.library.checkpoint_staging import StagingBuffer
from rtj_trainer.library.nvrx_compat import AsyncWriter

log = logging.getLogger(__name__)


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

    def count_blocking(self, started: float) -> None:
        """A save() call that began at ``started`` (``time.perf_counter()``) returns now."""
        blocking = time.perf_counter() - started
        self.last_blocking_seconds = blocking
        self.total_blocking_seconds += blocking


@dataclasses.dataclass
class WriteInFlight:
    step: int
    submitted: float
    buffer: StagingBuffer  # the staging buffer the writer reads: not to be reused until it is done


class ShardWrites:
    """This rank's writer process, the write it holds, and the ``.done`` files being written."""

    def __init__(
        self, root: Path, rank: int, world_size: int, durability: DurabilityWorker, stats: SaveStats
    ) -> None:
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.stats = stats
        self.writer: AsyncWriter | None = None  # started ahead of the first save, again after a death
        self.in_flight: WriteInFlight | None = None
        self._durability = durability
        self._done_marks: list[Future[None]] = []  # .done files being written

    def start(self) -> None:
        """Start the writer process now (spawning it takes seconds) rather than in the first save."""
        if self.writer is None:
            self.writer = AsyncWriter(self.rank)
            self.writer.start()

    def free(self) -> bool:
        """Whether the writer holds no write (it polls the one in flight first)."""
        if self.in_flight is not None:
            self.poll()
        return self.in_flight is None

    def submit(
        self, step: int, tensors: Mapping[str, torch.Tensor], extra: Mapping[str, Any], buffer: StagingBuffer
    ) -> None:
        """Hand the staged copy of ``step`` (``tensors``, in ``buffer``) to the writer, which is free."""
        if self.writer is None:
            self.writer = AsyncWriter(self.rank)
        payload = files.shard_payload(step, self.rank, self.world_size, tensors, extra)
        self.writer.submit(payload, str(files.shard_path(self.root, step, self.rank)))
        self.in_flight = WriteInFlight(step, time.perf_counter(), buffer)

    def poll(self) -> None:
        """Finalize the write in flight if it finished (its ``.done`` file follows), or abandon it if
        its writer died."""
        if self.in_flight is None and self.writer is not None and self.writer.pending():
            self.writer.poll()  # the warm-up request
        if self.in_flight is not None and self.writer is not None:
            if self.writer.poll():
                self.stats.last_write_seconds = time.perf_counter() - self.in_flight.submitted
                written = self.in_flight.step
                self._done_marks.append(self._durability.run(lambda: self._mark_done(written)))
                self.in_flight = None
            elif not self.writer.writer_alive():
                self._writer_died()

    def marking_done(self) -> bool:
        """Whether a ``.done`` file is still being written; one that could not be fails the caller."""
        for mark in [m for m in self._done_marks if m.done()]:
            self._done_marks.remove(mark)
            mark.result()
        return bool(self._done_marks)

    def close(self) -> None:
        self._done_marks.clear()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _mark_done(self, step: int) -> None:
        files.mark_done(self.root, step, self.rank, self.world_size)

    def _writer_died(self) -> None:
        assert self.in_flight is not None and self.writer is not None
        log.error(
            "checkpoint writer of rank %d died while saving step %d; the save is abandoned",
            self.rank,
            self.in_flight.step,
        )
        self.stats.writer_deaths += 1
        self.writer.close()
        self.writer = None
        self.in_flight = None
