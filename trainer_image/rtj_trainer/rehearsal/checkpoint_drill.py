"""A checkpoint drill: save sharded checkpoints in a loop until killed, then check what survived.

``python -m rtj_trainer.rehearsal.checkpoint_drill save --dir D`` runs the save side of
``rtj_trainer.library.checkpoint`` for several ranks in one process (each rank has its own manager and
writer process), with state whose every value encodes its step and rank, changing the state right
after each save call while the writers still run. Kill it (SIGKILL) at any moment;
``python -m rtj_trainer.rehearsal.checkpoint_drill check --dir D`` then resumes the way the trainer does (rank
0 commits what is complete, every rank loads the newest complete step) and verifies every byte.
The tests and ``bench/trainer_bench.py`` drive it.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rtj_trainer.library.checkpoint import CheckpointManager, list_checkpoints


def value_of(step: int, rank: int) -> float:
    return float(step * 16 + rank)


def drill_state(step: int, rank: int, tensors: int, numel: int) -> dict[str, torch.Tensor]:
    return {
        f"t{i}": torch.full((numel,), value_of(step, rank) + i, dtype=torch.float32) for i in range(tensors)
    }


def save_loop(root: Path, *, ranks: int, tensors: int, numel: int, keep: int, steps: int) -> None:
    managers = [
        CheckpointManager(root, rank=r, world_size=ranks, asynchronous=True, keep=keep) for r in range(ranks)
    ]
    states = [drill_state(0, r, tensors, numel) for r in range(ranks)]
    for step in range(1, steps + 1):
        for r, manager in enumerate(managers):
            for i, t in enumerate(states[r].values()):
                t.fill_(value_of(step, r) + i)
            manager.save(step, states[r], {"step": step})
            # Training goes on: the live tensors change while the writer runs.
            for t in states[r].values():
                t.add_(1000.0)
        for manager in managers:
            for committed in manager.poll():
                print(f"committed {committed}", flush=True)
    for manager in managers:
        manager.wait(timeout=None)
    for manager in managers:
        manager.poll()
        manager.close()


def check(root: Path, ranks: int, tensors: int, numel: int) -> dict[str, object]:
    """Resume like the trainer and verify the loaded shards; raises on any mismatch."""
    managers = [CheckpointManager(root, rank=r, world_size=ranks, asynchronous=False) for r in range(ranks)]
    partial_before = [c.step for c in list_checkpoints(root) if not c.committed]
    step = managers[0].newest_step()
    if step >= 0:
        for r, manager in enumerate(managers):
            _, payload = manager.load(step)
            expected = drill_state(step, r, tensors, numel)
            for name, tensor in expected.items():
                if not torch.equal(payload["tensors"][name], tensor):
                    raise AssertionError(
                        f"step {step} rank {r} tensor {name} differs from the state at the save"
                    )
    partial_after = [c.step for c in list_checkpoints(root) if not c.committed]
    return {"resumedStep": step, "partialBefore": partial_before, "partialAfter": partial_after}


def kill_during_saves(
    root: Path,
    rng: random.Random,
    *,
    max_delay_seconds: float,
    ranks: int = 2,
    tensors: int = 4,
    numel: int = 1 << 19,
    keep: int = 2,
    commit_timeout_seconds: float = 240,
) -> dict[str, object]:
    """One trial: run the save loop in a child process, SIGKILL it at a random moment (up to
    `max_delay_seconds`) after its first commit, while later saves are in flight, then `check`."""
    command = [sys.executable, "-m", "rtj_trainer.rehearsal.checkpoint_drill", "save", "--dir", str(root)]
    command += ["--ranks", str(ranks), "--tensors", str(tensors), "--numel", str(numel), "--keep", str(keep)]
    # The killed drill's resource tracker reports the semaphores it cleans up: expected, so not shown.
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + commit_timeout_seconds
            for line in proc.stdout:
                if line.startswith("committed"):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError("no checkpoint committed")
            time.sleep(rng.uniform(0.0, max_delay_seconds))
        finally:
            proc.kill()
            proc.wait(timeout=60)
    return check(root, ranks, tensors, numel)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtj_trainer.rehearsal.checkpoint_drill")
    p.add_argument("action", choices=("save", "check"))
    p.add_argument("--dir", required=True, type=Path)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--keep", type=int, default=2)
    p.add_argument("--steps", type=int, default=1_000_000)
    args = p.parse_args(argv)
    if args.action == "save":
        started = time.time()
        print(f"started {started}", flush=True)
        save_loop(
            args.dir,
            ranks=args.ranks,
            tensors=args.tensors,
            numel=args.numel,
            keep=args.keep,
            steps=args.steps,
        )
        return 0
    print(json.dumps(check(args.dir, args.ranks, args.tensors, args.numel)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
