"""Async checkpoints hold the state of the save call, and a kill at any moment never yields a
partial checkpoint on resume. Real NVRx writer processes, real files, real SIGKILL."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import torch
from rtj_trainer.library import checkpoint
from rtj_trainer.rehearsal import checkpoint_drill


def test_async_save_holds_the_state_at_the_save_call(tmp_path: Path) -> None:
    manager = checkpoint.CheckpointManager(tmp_path, rank=0, world_size=1, asynchronous=True, keep=10)
    state = {f"layer{i}": torch.randn(1 << 20) for i in range(8)}  # 32 MB: the write takes a while
    concurrent_trials = 0
    try:
        for step in range(1, 5):
            snapshot = {name: t.clone() for name, t in state.items()}
            manager.save(step, state, {"step": step})
            # Training goes on while the writer runs: every parameter changes in place.
            for t in state.values():
                t.mul_(-1.5).add_(float(step))
            manager.poll()
            if manager._pending is not None:
                concurrent_trials += 1  # the writer had not finished when the state changed
            assert manager.wait(timeout=300)
            assert manager.poll() == [] or manager.last_committed is not None
            assert manager.wait_committed(step, timeout=60)
            info, payload = manager.load(step)
            assert info.step == step
            for name, tensor in snapshot.items():
                assert torch.equal(payload["tensors"][name], tensor), f"{name} of step {step} is torn"
    finally:
        manager.close()
    assert concurrent_trials >= 1, "the state never changed while a write was in flight"


@pytest.mark.slow
def test_sigkill_during_async_saves_never_resumes_a_partial_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(20261129)
    trials = 10
    partial_seen = 0
    resumed: list[int] = []
    for trial in range(trials):
        root = tmp_path / f"trial-{trial}"
        # Kill at a random moment of the save stream, after the first commit.
        result = checkpoint_drill.kill_during_saves(root, rng, max_delay_seconds=1.0)
        assert isinstance(result["resumedStep"], int) and result["resumedStep"] >= 1
        resumed.append(result["resumedStep"])
        if result["partialBefore"]:
            partial_seen += 1
        # What resume chose is the newest committed one; nothing newer is complete.
        newest = checkpoint.newest_complete(root, 2)
        assert newest is not None and newest.step == result["resumedStep"]
    # The kills landed while saves were in flight (partial directories existed) in most trials.
    assert partial_seen >= trials // 2, (partial_seen, resumed)


def test_a_dead_writer_is_noticed_and_replaced(tmp_path: Path) -> None:
    manager = checkpoint.CheckpointManager(tmp_path, rank=0, world_size=1, asynchronous=True, keep=10)
    try:
        manager.start_writer()
        assert manager._writer is not None
        pid = manager._writer.writer_pid()
        assert pid is not None
        manager.save(1, {"w": torch.randn(1 << 16)}, {})
        assert manager.wait(timeout=300) and manager.wait_committed(1, timeout=60)
        # The writer dies while it holds a save: polling notices instead of blocking forever.
        os.kill(pid, signal.SIGKILL)
        manager.save(2, {"w": torch.randn(1 << 16)}, {})
        assert manager.wait(timeout=120)
        assert manager.stats.writer_deaths == 1
        assert not checkpoint.done_path(tmp_path, 2, 0).exists()
        newest = checkpoint.newest_complete(tmp_path, 1)
        assert newest is not None and newest.step == 1
        # The next save gets a new writer and commits.
        manager.save(3, {"w": torch.ones(4)}, {})
        assert manager.wait(timeout=300) and manager.wait_committed(3, timeout=60)
        assert manager._writer is not None and manager._writer.writer_pid() not in (None, pid)
        _, payload = manager.load(3)
        assert torch.equal(payload["tensors"]["w"], torch.ones(4))
    finally:
        manager.close()
