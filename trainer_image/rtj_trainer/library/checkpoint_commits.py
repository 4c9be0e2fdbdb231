"""Which checkpoints are committed, as one rank knows it, kept off the training thread.

The checkpoint manager (``rtj_trainer.library.checkpoint``) saves; this module follows the commits.
Rank 0 (the committer) commits each saved step once every rank's shard is durable and prunes the old
ones; the other ranks re-read the newest commit from the volume every few seconds. Each check is
fsyncs and directory listings on the shared volume (``checkpoint_files``), tens of milliseconds on a
busy one, so for async saves they run on the durability worker's thread, in order with the ``.done``
files ``checkpoint_writes`` has it write.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from rtj_trainer.library import checkpoint_files as files
from rtj_trainer.library.checkpoint_files import CheckpointInfo

_T = TypeVar("_T")
# How often a rank that does not commit re-reads the newest commit from the volume, at most.
_REFRESH_SECONDS: Final = 2.0


class DurabilityWorker:
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


class CommitTracker:
    """The saved steps awaiting their commit (rank 0) and the newest committed checkpoint."""

    def __init__(
        self, root: Path, rank: int, world_size: int, keep: int, durability: DurabilityWorker
    ) -> None:
        self.root = root
        self.world_size = world_size
        self.keep = keep
        self.is_committer = rank == 0
        self.last_committed: CheckpointInfo | None = files.newest_complete(root, world_size)
        self._durability = durability
        self._uncommitted: list[int] = []  # rank 0: saved steps awaiting their commit
        self._last_refresh = time.monotonic()
        self._check: Future[_CommitCheck] | None = None

    def saved(self, step: int) -> None:
        """A durable save of ``step`` was asked for: the committer commits it once it is complete."""
        if self.is_committer:
            self._uncommitted.append(step)

    def refresh(self) -> CheckpointInfo | None:
        """Re-read the newest complete checkpoint from the volume."""
        self.last_committed = files.newest_complete(self.root, self.world_size)
        return self.last_committed

    def poll(self) -> list[int]:
        """Collect the last commit check, start the next one (rank 0: while saves await their commit;
        the other ranks: re-read the newest commit at most every few seconds). Returns newly
        committed steps."""
        committed = self._collect()
        if self._check is not None:
            return committed
        if self.is_committer:
            if self.last_committed is not None:
                # A save abandoned by a dead writer never commits: forget it once a newer one did.
                newest = self.last_committed.step
                self._uncommitted = [s for s in self._uncommitted if s > newest]
            if not self._uncommitted:
                return committed
            steps = list(self._uncommitted)
            self._check = self._durability.run(lambda: self._commit_steps(steps))
        else:
            now = time.monotonic()
            if now - self._last_refresh <= _REFRESH_SECONDS:
                return committed
            self._last_refresh = now
            self._check = self._durability.run(
                lambda: _CommitCheck([], files.newest_complete(self.root, self.world_size))
            )
        return committed + self._collect()

    def discard_partials_after(self, step: int) -> list[Path]:
        """Delete uncommitted directories newer than ``step`` and forget their saves."""
        self._durability.drain()  # no commit check may be listing a directory deleted below
        self._collect()
        removed = files.discard_partials_after(self.root, step)
        self._uncommitted = [s for s in self._uncommitted if s <= step]
        return removed

    def close(self) -> None:
        self._check = None

    def _commit_steps(self, steps: list[int]) -> _CommitCheck:
        """Rank 0, off the training thread: commit what is complete, then prune."""
        committed = []
        for step in steps:
            try:
                if files.try_commit(self.root, step):
                    committed.append(step)
            except OSError:
                continue  # the directory was discarded meanwhile (a resume chose an older step)
        if not committed:
            return _CommitCheck([], None)
        newest = files.newest_complete(self.root)
        files.prune(self.root, self.keep)
        return _CommitCheck(committed, newest)

    def _collect(self) -> list[int]:
        check = self._check
        if check is None or not check.done():
            return []
        self._check = None
        result = check.result()
        self._uncommitted = [s for s in self._uncommitted if s not in result.committed]
        if result.newest is not None:
            self.last_committed = result.newest
        return result.committed
