"""Where an in-process iteration of ``rtj-train`` resumes, agreed by every rank, and the state put back.

The trainer (``train``) keeps its newest state in memory across in-process restarts
(``InMemoryState``: references to the tensors, not copies) and, in supervisor mode, copies of it on
a peer (``replica``, every ``RTJ_MEMORY_INTERVAL_STEPS`` steps: ``replicate_when_due``). An
iteration resumes from memory when every rank holds the same intact step, in supervisor mode from
the replicas when the lost ranks' states are there, else from the newest checkpoint that verifies
on every rank (``rtj_trainer.CheckpointManager``), else from scratch; the state goes into the
freshly built model and optimizer (``model.restore_local_state``).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

import rtj_trainer
from rtj_trainer.reference import replica
from rtj_trainer.reference.model import restore_local_state

log = logging.getLogger("rtj_trainer")


@dataclasses.dataclass
class InMemoryState:
    """The newest state in memory, kept across in-process restarts (references, not copies)."""

    step: int = -1
    tensors: dict[str, torch.Tensor] | None = None
    consistent: bool = False
    rank: int = -1
    world_size: int = -1
    useful_seconds: float = 0.0


def replicate_when_due(
    env: rtj_trainer.JobSettings, tier: replica.MemoryTier, in_memory: InMemoryState, step: int
) -> None:
    """The memory tier: every RTJ_MEMORY_INTERVAL_STEPS steps, this rank's state to a peer on
    another node, and that peer's to this rank (supervisor mode: a reserve rank that takes a
    lost rank's index resumes from the copy)."""
    interval = env.memory_interval_steps
    tensors = in_memory.tensors
    if not env.supervisor_mode or interval <= 0 or step % interval != 0 or tensors is None:
        return
    tier.replicate(step, tensors)


@dataclasses.dataclass(frozen=True)
class Place:
    """This rank in the training world, and the device its collectives use."""

    rank: int
    world_size: int
    device: torch.device


class StateRestore:
    """One iteration's resume: the step every rank agrees on, and this rank's state of it restored."""

    def __init__(
        self,
        place: Place,
        env: rtj_trainer.JobSettings,
        ckpt: rtj_trainer.CheckpointManager,
        in_memory: InMemoryState,
        tier: replica.MemoryTier,
    ) -> None:
        self.place = place
        self.env = env
        self.ckpt = ckpt
        self.mem = in_memory
        self.tier = tier

    def resume(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, progress: rtj_trainer.Progress
    ) -> tuple[int, str]:
        """The step resumed at and where from (memory, memory-replica, checkpoint or scratch); a
        checkpoint's commit goes into ``progress``."""
        if self.env.supervisor_mode and self.env.memory_interval_steps > 0:
            resumed = self._from_replicas(model, opt)
            if resumed is not None:
                return resumed
        if self._memory_agreed():
            assert self.mem.tensors is not None
            restore_local_state(model, opt, self.mem.tensors)
            return self.mem.step, "memory"
        return self._from_checkpoint(model, opt, progress)

    def _memory_agreed(self) -> bool:
        """Whether every rank holds the same intact step in memory (a collective)."""
        mem, place = self.mem, self.place
        usable = (
            mem.tensors is not None
            and mem.consistent
            and mem.world_size == place.world_size
            and mem.rank in (-1, place.rank)
        )
        mem_step = mem.step if usable else -1
        agree = torch.tensor([1 if usable else 0, mem_step, -mem_step], dtype=torch.long, device=place.device)
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        return int(agree[0]) == 1 and int(agree[1]) == -int(agree[2])

    def _from_checkpoint(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, progress: rtj_trainer.Progress
    ) -> tuple[int, str]:
        mem = self.mem
        # A save still in flight from before the fault finishes first: it may complete a checkpoint,
        # and no writer may still be writing into a directory that rank 0 discards below. (Resuming
        # from memory does not wait: the save goes on in the background.)
        self.ckpt.wait(timeout=None)
        step = newest_verified_checkpoint(self.ckpt, self.place)
        if step < 0:
            mem.useful_seconds = 0.0
            mem.step = 0
            return 0, "scratch"
        info, payload = self.ckpt.load(step)
        restore_local_state(model, opt, payload["tensors"])
        mem.useful_seconds = float(payload["extra"].get("usefulStepSeconds", 0.0))
        mem.step = step
        progress.last_checkpoint_step = info.step
        progress.last_checkpoint_time = info.time
        return step, "checkpoint"

    def _from_replicas(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, str] | None:
        """Supervisor mode: every index's state from memory, the lost ones' from their replicas."""
        mem, place = self.mem, self.place
        live = (
            mem.tensors is not None
            and mem.consistent
            and mem.rank == place.rank
            and mem.world_size == place.world_size
        )
        reports = replica.gather_reports(
            self.tier, mem.step if live else -1, place.rank, place.world_size, place.device
        )
        plan = replica.plan_resume(reports)
        if plan.source != "memory":
            log.info("rank %d: not resuming from memory: %s", place.rank, plan.reason)
            return None
        # Adam's state is created lazily: a fresh optimizer has no layout to check against, and
        # restore_local_state checks every shape.
        received = replica.execute_transfers(plan, self.tier, place.rank)
        source = "memory-replica" if received is not None else "memory"
        if received is None and place.rank in plan.snapshots:
            # A peer was lost in the middle of an exchange: every rank goes back to the step the
            # replicas hold, this one from the copy of its state it sent.
            received = replica.own_state(self.tier, plan.step)
        if received is None:
            assert mem.tensors is not None
            received = mem.tensors
        restore_local_state(model, opt, received)
        mem.step = plan.step
        return plan.step, source


def newest_verified_checkpoint(ckpt: rtj_trainer.CheckpointManager, place: Place) -> int:
    """The newest checkpoint every rank's shard of which verifies (-1: none), agreed
    (`CheckpointManager.newest_verified_step`)."""

    def agreed_newest() -> int:
        """Rank 0's newest complete checkpoint, on every rank (-1: none)."""
        dist.barrier()
        newest = torch.tensor(
            [ckpt.newest_step() if place.rank == 0 else -1], dtype=torch.long, device=place.device
        )
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        step = int(newest[0])
        if place.rank == 0:
            # Partial saves newer than the resume point belong to the failed attempt. Their stale
            # .done files must not let the next save of the same step commit before it is written.
            ckpt.discard_partials_after(step)
        return step

    def on_every_rank(true_here: bool) -> bool:
        flag = torch.tensor([1 if true_here else 0], dtype=torch.long, device=place.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(int(flag[0]))

    return ckpt.newest_verified_step(agreed_newest, on_every_rank)
