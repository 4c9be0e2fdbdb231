"""Reading a checkpoint back: the newest complete one, whether this rank's shard of it verifies, its shard.

``CheckpointReader`` is one rank's resume side of the checkpoints on the volume (``checkpoint_files``
has the layout and the checks); the checkpoint manager (``rtj_trainer.library.checkpoint``) is a
reader that also saves, and keeps what it loaded as the newest commit it knows of. The collectives
that make the ranks agree on a step are the caller's (the session's, ``rtj-train``'s): they are
passed in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rtj_trainer.library import checkpoint_files as files
from rtj_trainer.library.checkpoint_files import CheckpointInfo

log = logging.getLogger(__name__)


class CheckpointReader:
    """One rank's reads of the committed checkpoints under ``root`` of a world of ``world_size``."""

    def __init__(self, root: str | os.PathLike[str], *, rank: int, world_size: int) -> None:
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size

    @property
    def is_committer(self) -> bool:
        return self.rank == 0

    def newest_step(self) -> int:
        """The newest complete checkpoint of this world size (-1: none). Ranks must agree on it:
        the trainer takes rank 0's answer, after rank 0 committed what was left complete."""
        if self.is_committer:
            files.commit_ready(self.root)
        info = files.newest_complete(self.root, self.world_size)
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
        return files.shard_problem(self.root, step, self.rank)

    def quarantine(self, step: int) -> Path | None:
        """Set the checkpoint of ``step`` aside (rank 0, when a rank found its shard corrupt): renamed
        ``corrupt-step-...`` in place, no longer a checkpoint to resume from or to prune."""
        return files.quarantine(self.root, step)

    def load(self, step: int) -> tuple[CheckpointInfo, dict[str, Any]]:
        """This rank's shard of the committed checkpoint ``step``."""
        info = next((c for c in files.list_checkpoints(self.root) if c.step == step and c.committed), None)
        if info is None or info.world_size != self.world_size:
            raise RuntimeError(f"no complete checkpoint of step {step} for {self.world_size} ranks")
        payload = torch.load(
            files.shard_path(self.root, info.step, self.rank), map_location="cpu", weights_only=True
        )
        if int(payload["step"]) != info.step or int(payload["rank"]) != self.rank:
            raise RuntimeError(f"checkpoint shard {info.path} does not belong to rank {self.rank}")
        return info, payload
