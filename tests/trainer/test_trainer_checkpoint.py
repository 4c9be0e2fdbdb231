"""Async checkpoints hold the state of the save call, and a kill at any moment never yields a
partial checkpoint on resume. Real NVRx writer processes, real files, real SIGKILL."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import torch
from file_faults import flip_a_bit
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
            if manager._writes.in_flight is not None:
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
        assert manager._writes.writer is not None
        pid = manager._writes.writer.writer_pid()
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
        assert manager._writes.writer is not None and manager._writes.writer.writer_pid() not in (None, pid)
        _, payload = manager.load(3)
        assert torch.equal(payload["tensors"]["w"], torch.ones(4))
    finally:
        manager.close()


# --- verified restores -------------------------------------------------------------------------------


def _two_saves(root: Path) -> checkpoint.CheckpointManager:
    manager = checkpoint.CheckpointManager(root, rank=0, world_size=1, asynchronous=False, keep=5)
    for step in (2, 4):
        manager.save(step, {"w": torch.full((1024,), float(step))}, {"step": step})
        assert manager.wait_committed(step, timeout=30)
    assert [c.step for c in checkpoint.list_checkpoints(root) if c.committed] == [2, 4]
    return manager


def test_a_shard_is_verified_against_the_size_and_crc_its_rank_recorded(tmp_path: Path) -> None:
    manager = _two_saves(tmp_path)
    assert manager.verify(2) is None and manager.verify(4) is None
    flip_a_bit(checkpoint.shard_path(tmp_path, 4, 0))
    problem = manager.verify(4)
    assert problem is not None and "step 4 is corrupt: CRC-32" in problem
    # torch.load itself would have read it without a word: what verify() is for.
    _, payload = manager.load(4)
    assert not torch.equal(payload["tensors"]["w"], torch.full((1024,), 4.0))
    checkpoint.shard_path(tmp_path, 2, 0).write_bytes(b"")
    assert "step 2 is corrupt" in (manager.verify(2) or "")
    # A .done written before checksums (library < 0.4.0) is trusted; a missing shard is not.
    done = checkpoint.done_path(tmp_path, 4, 0)
    done.write_text('{"rank": 0, "worldSize": 1, "time": 0}')
    assert manager.verify(4) is None
    checkpoint.shard_path(tmp_path, 4, 0).unlink()
    done.write_text('{"rank": 0, "worldSize": 1, "time": 0, "crc32": 1, "bytes": 1}')
    assert "cannot be read" in (manager.verify(4) or "")


def test_rtj_trains_restore_sets_a_corrupt_checkpoint_aside_and_falls_back(tmp_path: Path) -> None:
    import torch.distributed as dist
    from rtj_trainer.reference.resume import Place, newest_verified_checkpoint

    manager = _two_saves(tmp_path)
    flip_a_bit(checkpoint.shard_path(tmp_path, 4, 0))
    place = Place(rank=0, world_size=1, device=torch.device("cpu"))  # what the restore's agreement uses
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert newest_verified_checkpoint(manager, place) == 2
    finally:
        dist.destroy_process_group()
    assert [p.name.rsplit("-", 1)[0] for p in tmp_path.glob("corrupt-*")] == ["corrupt-step-000000004"]
    assert manager.newest_step() == 2
