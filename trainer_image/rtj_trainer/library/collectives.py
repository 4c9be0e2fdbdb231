"""The session's few collectives on the default process group; without one, a single rank's answers.

``rtj_trainer.library.session`` and its checkpoints (``session_checkpoints``) agree across ranks on
a drain, on the step to resume from and on whether a shard verified on every rank: small integer
all-reduces on the device the process group's backend uses. A script that never made a process
group is one rank, and torch is not imported for it (nothing here imports torch at import time).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def world_size() -> int:
    """The process group's size; 1 without one (torch not even imported: no process group)."""
    if "torch" not in sys.modules:
        return 1
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank_and_world_size() -> tuple[int, int]:
    """From the process group, else from the launcher's environment (a single rank without either)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1)


def collective_device() -> torch.device:
    """Where a small tensor for the default process group lives: CUDA for NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def on_every_rank(true_here: bool) -> bool:
    """Whether `true_here` holds on every rank (one small all-reduce in a process group)."""
    if world_size() == 1:
        return true_here
    return _all_reduce(1 if true_here else 0, maximum=False) == 1


def largest(value: int) -> int:
    """The largest of every rank's `value` (one small all-reduce in a process group)."""
    if world_size() == 1:
        return value
    return _all_reduce(value, maximum=True)


def barrier() -> None:
    """Every rank waits for the others (nothing to wait for without a process group)."""
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def _all_reduce(value: int, *, maximum: bool) -> int:
    import torch
    import torch.distributed as dist

    reduced = torch.tensor([value], dtype=torch.long, device=collective_device())
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX if maximum else dist.ReduceOp.MIN)
    return int(reduced[0])
