"""A session's checkpoints: a script's state dict saved and loaded through the checkpoint manager.

``rtj_trainer.library.session`` keeps one ``SessionCheckpoints`` per process. It makes the manager
(``checkpoint``) at the first save or load, when the process group is up, splits a state dict into
the shard's tensors and its skeleton and joins them back (``state_tree``), agrees with the other ranks
on the step to resume from (``collectives``), and waits for the commits a drain and the end of the
block need. Without a checkpoint directory it saves nothing. torch is imported with the manager.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rtj_contract import env as env_names

from rtj_trainer.library import collectives
from rtj_trainer.library import env as env_mod
from rtj_trainer.library.state_tree import join_state, split_state

if TYPE_CHECKING:
    import torch

    from rtj_trainer.library.checkpoint import CheckpointInfo, CheckpointManager

# The session's logger, whichever of its modules logs: a script filters on this one name.
log = logging.getLogger("rtj_trainer.session")


@dataclasses.dataclass(frozen=True)
class Restored:
    """A checkpoint loaded back: its step, the state as saved, and what the manager knows of it."""

    step: int
    state: dict[str, Any]
    info: CheckpointInfo
    extra: Mapping[str, Any]


class SessionCheckpoints:
    """The checkpoint manager of a session, made at first use, and the steps the script saved."""

    def __init__(
        self,
        directory: str | None,
        env: env_mod.TrainerEnv,
        *,
        keepalive: Callable[[], None] | None,
        commit_timeout: float,
    ) -> None:
        self.directory = directory
        self._env = env
        self._keepalive = keepalive
        self._commit_timeout = commit_timeout
        self.manager: CheckpointManager | None = None
        self.last_saved: int | None = None
        self.own_checkpoint: int | None = None  # the step of the script's own checkpoint, reported

    @property
    def last_committed(self) -> CheckpointInfo | None:
        return self.manager.last_committed if self.manager is not None else None

    def save(self, step: int, state_dict: Mapping[str, Any], extra: Mapping[str, Any]) -> float | None:
        """Save this rank's part of ``state_dict`` (with ``extra``) after ``step`` steps; how long it
        held training up, or None without a checkpoint directory."""
        manager = self._manager()
        if manager is None:
            return None
        tensors: dict[str, torch.Tensor] = {}
        skeleton = split_state(state_dict, (), tensors)
        manager.save(step, tensors, {**extra, "state": skeleton})
        self.last_saved = step
        return manager.stats.last_blocking_seconds

    def load(self, like: Mapping[str, Any] | None) -> Restored | None:
        """The newest checkpoint that every rank's shard verifies, agreed, or None (none, or no
        checkpoint directory)."""
        manager = self._manager()
        if manager is None:
            return None
        step = manager.newest_verified_step(
            lambda: self._agreed_newest_step(manager), collectives.on_every_rank
        )
        if step < 0:
            return None
        info, payload = manager.load(step)
        extra = payload["extra"]
        if "state" not in extra:
            raise RuntimeError(
                f"the checkpoint of step {step} in {manager.root} was not saved by Session.save"
            )
        return Restored(step, join_state(extra["state"], payload["tensors"], like, ()), info, extra)

    def poll(self) -> bool:
        """Finalize and commit what finished; whether a checkpoint committed."""
        return self.manager is not None and bool(self.manager.poll())

    def commit(self, step: int, save: Callable[[], None] | None) -> bool:
        """Whether the checkpoint of ``step`` committed, for a drain: ``save`` saves it first (unless
        it is committed already), then the commit is waited for; without ``save`` the script's own
        checkpoint of ``step`` counts. The other ranks see the commit at once."""
        manager = self._manager() if save is not None else self.manager
        committed = self.own_checkpoint == step
        if manager is None:
            return committed
        already = manager.last_committed is not None and manager.last_committed.step == step
        if save is not None and not already:
            save()
        if already or self.last_saved == step:
            committed = manager.wait_committed(step, timeout=self._commit_timeout)
        manager.poll()
        manager.refresh()  # the other ranks see the commit at once, not at their next re-read
        return committed

    def finish(self) -> None:
        """The block ended normally: this rank's saves written, the last one committed (on the
        committing rank)."""
        manager = self.manager
        if manager is None:
            return
        manager.wait(timeout=self._commit_timeout)
        last = self.last_saved
        if (
            last is not None
            and manager.is_committer
            and not manager.wait_committed(last, timeout=self._commit_timeout)
        ):
            log.error("the checkpoint of step %d did not commit", last)
        manager.poll()
        manager.refresh()

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()

    def _manager(self) -> CheckpointManager | None:
        """The checkpoint manager, made at the first save or load (the process group is up by then)."""
        if self.manager is not None or self.directory is None:
            return self.manager
        from rtj_trainer.library.checkpoint import CheckpointManager

        rank, world_size = collectives.rank_and_world_size()
        self.manager = CheckpointManager(
            self.directory,
            rank=rank,
            world_size=world_size,
            asynchronous=self._env.checkpoint_mode == env_names.MODE_ASYNC,
            keep=self._env.checkpoint_keep,
            keepalive=self._keepalive,
        )
        return self.manager

    def _agreed_newest_step(self, manager: CheckpointManager) -> int:
        """The newest complete checkpoint, the same on every rank (-1: none); partial saves newer
        than it, left by the failed attempt, are discarded (their stale ``.done`` files would let
        the next save of the same step commit early)."""
        from rtj_trainer.library import checkpoint

        manager.wait(timeout=None)  # a save of this process still in flight may complete one
        if collectives.world_size() == 1:
            found = checkpoint.newest_complete(manager.root, manager.world_size)
            step = -1 if found is None else found.step
        else:
            step = collectives.largest(manager.newest_step() if manager.is_committer else -1)
        if manager.is_committer:
            manager.discard_partials_after(step)
            _warn_other_world_size(manager, step)
        collectives.barrier()  # no rank saves into a directory that rank 0 is still discarding
        return step


def _warn_other_world_size(manager: CheckpointManager, step: int) -> None:
    from rtj_trainer.library import checkpoint

    newest = checkpoint.newest_complete(manager.root)
    if newest is not None and newest.step > step:
        log.warning(
            "checkpoint of step %d is for %s ranks, not %d: not loaded",
            newest.step,
            newest.world_size,
            manager.world_size,
        )
