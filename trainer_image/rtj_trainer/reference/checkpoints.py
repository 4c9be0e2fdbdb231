"""``rtj-train``'s checkpoints: the manager of this rank's index, the loop's saves, the commits it waits for.

The trainer (``train``) saves its in-memory state (``resume.InMemoryState``) through the public
``rtj_trainer.CheckpointManager``: every ``intervalSteps`` a save point that every rank writes, or
none does while a writer somewhere is still busy; a drain's checkpoint of the step it ends at; and
the final one. A reserve rank that takes a lost rank's index takes a manager of that index. The
resume side (the newest checkpoint that verifies on every rank) is ``resume``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

import rtj_trainer
from rtj_trainer.reference.resume import InMemoryState


class TrainerCheckpoints:
    """The checkpoint manager of this rank's index, saving the state held in ``in_memory``."""

    def __init__(
        self,
        checkpoint_dir: str,
        *,
        rank: int,
        world_size: int,
        asynchronous: bool,
        keep: int,
        keepalive: Callable[[], None],
        in_memory: InMemoryState,
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.world_size = world_size
        self.asynchronous = asynchronous
        self.keep = keep
        self.keepalive = keepalive
        self.in_memory = in_memory
        self.manager = self._manager_of(rank)

    def take_index(self, rank: int) -> None:
        """From now on this rank saves as rank ``rank`` (a reserve rank activated in its place)."""
        self.manager.close()
        self.manager = self._manager_of(rank)

    def save(self, step: int, loss_value: float, *, write: bool = True) -> float:
        """Save the state in memory as ``step``'s; returns how long the save held training up."""
        extra = {"usefulStepSeconds": self.in_memory.useful_seconds, "loss": loss_value}
        self.manager.save(step, self.in_memory.tensors or {}, extra, write=write)
        return self.manager.stats.last_blocking_seconds

    def save_point(
        self, step: int, loss_value: float, device: torch.device, atomic: AbstractContextManager[object]
    ) -> float:
        """A save point: every rank writes it or none does (a writer still busy: the state stays in
        memory only, the durable checkpoint one write behind). The save runs inside ``atomic``."""
        write = self.manager.ready_to_write_everywhere(device)
        # Not interrupted half-way by a restart: the writer's queue and the pending save must stay
        # in step.
        with atomic:
            return self.save(step, loss_value, write=write)

    def commit(self, step: int, loss_value: float, timeout: float) -> tuple[bool, float]:
        """A drain's checkpoint of ``step``: saved unless it is committed already, then its commit
        waited for; whether it committed, and how long the save held training up."""
        blocking = 0.0
        last = self.manager.last_committed
        if last is None or last.step != step:
            blocking = self.save(step, loss_value)
        committed = self.manager.wait_committed(step, timeout=timeout)
        self.manager.poll()
        return committed, blocking

    def commit_final(self, steps: int, loss_value: float, timeout: float) -> None:
        """The final checkpoint, of ``steps``, saved unless committed already, and committed."""
        final = self.manager.last_committed
        if final is None or final.step != steps:
            self.save(steps, loss_value)
        # Waits poll (with heartbeats) rather than sit in a collective: a rank whose shard is written
        # first would otherwise fall silent for as long as the slowest rank's write takes.
        self.manager.wait(timeout=None)
        if not self.manager.wait_committed(steps, timeout=timeout):
            raise RuntimeError(f"final checkpoint of step {steps} did not commit")

    def finished_line(self, steps: int, loop_seconds: float) -> str:
        """One line for scripts (bench/trainer_bench.py): this process's loop, final commit included."""
        stats = self.manager.stats
        return (
            f"rtj-train: finished steps={steps} loop_seconds={loop_seconds:.3f} "
            f"useful_step_seconds={self.in_memory.useful_seconds:.3f} "
            f"checkpoint_blocking_seconds={stats.total_blocking_seconds:.3f} saves={stats.saves} "
            f"mode={'Async' if self.manager.asynchronous else 'Sync'}"
        )

    def _manager_of(self, rank: int) -> rtj_trainer.CheckpointManager:
        return rtj_trainer.CheckpointManager(
            self.checkpoint_dir,
            rank=rank,
            world_size=self.world_size,
            asynchronous=self.asynchronous,
            keep=self.keep,
            keepalive=self.keepalive,
            # An async save's copy overlaps the next step's compute (wait_staged() before opt.step).
            stage_in_background=True,
        )
