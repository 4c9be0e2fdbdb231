"""Async saves that overlap the next step: the copy into host memory runs in the background until
`wait_staged()`, and a save point that finds a writer busy is skipped on every rank alike, so only
steps every rank wrote commit and the final save always lands. Real NVRx writer processes, real
files, real gloo collectives."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from rtj_localcluster.ports import reserve_port
from rtj_trainer.library import checkpoint


def _state(megabytes: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f"layer{i}": torch.randn(1 << 18, generator=gen) for i in range(megabytes)}  # 1 MiB each


def _background_manager(root: Path, rank: int = 0, world_size: int = 1) -> checkpoint.CheckpointManager:
    return checkpoint.CheckpointManager(
        root, rank=rank, world_size=world_size, asynchronous=True, keep=100, stage_in_background=True
    )


def test_wait_staged_holds_the_update_until_the_copy_is_complete(tmp_path: Path) -> None:
    manager = _background_manager(tmp_path)
    state = _state(64, seed=1)
    try:
        for step in range(1, 4):
            snapshot = {name: t.clone() for name, t in state.items()}
            manager.save(step, state, {"step": step})
            manager.wait_staged()
            staged = manager._staging.staged
            assert staged is not None and staged.copy.done()
            # The optimizer step: every saved value changes in place while the writer may still run.
            for t in state.values():
                t.mul_(-3.0).add_(float(step))
            assert manager.wait(timeout=300)
            assert manager.wait_committed(step, timeout=120)
            _, payload = manager.load(step)
            for name, tensor in snapshot.items():
                assert torch.equal(payload["tensors"][name], tensor), f"{name} of step {step} differs"
    finally:
        manager.close()
    assert manager.stats.saves == 3 and manager.stats.skipped == 0


def test_a_save_while_the_writer_is_busy_is_queued_and_every_save_lands(tmp_path: Path) -> None:
    manager = _background_manager(tmp_path)
    state = _state(32, seed=2)
    snapshots = {}
    try:
        # Three durable saves back to back: the first is written, the second waits in the other
        # staging buffer, the third waits for the writer to free one. None is dropped.
        for step in (1, 2, 3):
            snapshots[step] = {name: t.clone() for name, t in state.items()}
            manager.save(step, state, {"step": step})
            manager.wait_staged()
            if step == 2:
                # The writer process is still starting (seconds) and holds step 1: step 2 is queued.
                assert manager._writes.in_flight is not None and manager._writes.in_flight.step == 1
                assert manager._staging.write_queued()
            for t in state.values():
                t.add_(1.0)
        # The end of training: wait for everything, then for the commit of the last step.
        assert manager.wait(timeout=300)
        assert manager.wait_committed(3, timeout=120)
        for step, snapshot in snapshots.items():
            assert (checkpoint.step_dir(tmp_path, step) / checkpoint.COMMIT_MARKER).is_file()
            _, payload = manager.load(step)
            assert all(torch.equal(payload["tensors"][n], t) for n, t in snapshot.items()), step
    finally:
        manager.close()
    assert manager.stats.saves == 3 and manager.stats.skipped == 0


def test_a_save_skipped_by_one_rank_never_commits(tmp_path: Path) -> None:
    ranks = [
        checkpoint.CheckpointManager(tmp_path, rank=r, world_size=2, asynchronous=True, keep=100)
        for r in (0, 1)
    ]
    states = [_state(2, seed=10 + r) for r in (0, 1)]
    try:
        # Ranks that decide alone can disagree: rank 0 writes step 10, rank 1 skips it.
        ranks[0].save(10, states[0], {}, write=True)
        ranks[1].save(10, states[1], {}, write=False)
        for manager in ranks:
            assert manager.wait(timeout=300)
        assert ranks[0].poll() == []
        assert not (checkpoint.step_dir(tmp_path, 10) / checkpoint.COMMIT_MARKER).exists()
        assert ranks[1].stats.skipped == 1
        for manager in ranks:
            manager.save(20, states[manager.rank], {}, write=True)
        for manager in ranks:
            assert manager.wait(timeout=300)
        assert ranks[0].wait_committed(20, timeout=120)
    finally:
        for manager in ranks:
            manager.close()
    # Step 10 never committed; as a partial save older than the newest commit it was pruned.
    assert [(c.step, c.committed) for c in checkpoint.list_checkpoints(tmp_path)] == [(20, True)]


def _agreeing_rank(rank: int, root: str, port: int, out: str, megabytes: int) -> None:
    """One rank of two: a save every step, with `write` agreed by all ranks, as the trainer does.
    Runs until both outcomes were seen (the same decision on both ranks, so they stop together)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    manager = _background_manager(Path(root), rank=rank, world_size=2)
    manager.start_writer()
    state = {f"t{i}": torch.zeros(1 << 18) for i in range(megabytes)}
    decisions: dict[int, bool] = {}
    try:
        step = 0
        while step < 300 and (sum(decisions.values()) < 3 or all(decisions.values())):
            step += 1
            manager.wait_staged()
            for i, t in enumerate(state.values()):
                t.fill_(_value(step, rank, i))  # in place, as opt.step()
            time.sleep(0.05)
            write = manager.ready_to_write_everywhere(torch.device("cpu"))
            manager.save(step, state, {"step": step}, write=write)
            decisions[step] = write
            manager.poll()
        manager.wait_staged()
        # The final save is not subject to the agreement: it always writes, and every rank waits.
        final = step + 1
        for i, t in enumerate(state.values()):
            t.fill_(_value(final, rank, i))
        manager.save(final, state, {"step": final})
        assert manager.wait(timeout=300)
        assert manager.wait_committed(final, timeout=300)
        report = {"decisions": decisions, "skipped": manager.stats.skipped, "final": final}
        Path(out).write_text(json.dumps(report))
        dist.barrier()
    finally:
        manager.close()
        dist.destroy_process_group()


def _value(step: int, rank: int, index: int) -> float:
    return step * 1000.0 + rank * 100.0 + index


@pytest.mark.slow
def test_ranks_agree_on_skipped_saves_so_only_steps_every_rank_wrote_commit(tmp_path: Path) -> None:
    root, port = tmp_path / "ckpt", reserve_port()
    ctx = multiprocessing.get_context("spawn")
    # Rank 1's shard is 64 times rank 0's: its writer is still busy when rank 0's is free.
    sizes = {0: 1, 1: 64}
    procs = [
        ctx.Process(
            target=_agreeing_rank, args=(r, str(root), port, str(tmp_path / f"rank{r}.json"), sizes[r])
        )
        for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=900)
    assert [proc.exitcode for proc in procs] == [0, 0]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[1]["decisions"] == reports[0]["decisions"], "the ranks skipped different steps"
    decisions = {int(k): v for k, v in reports[0]["decisions"].items()}
    written = sorted(s for s, w in decisions.items() if w)
    skipped = sorted(s for s, w in decisions.items() if not w)
    assert skipped and len(written) >= 3, decisions
    assert reports[0]["skipped"] == reports[1]["skipped"] == len(skipped)
    # Every step the ranks wrote committed, the final one too; a skipped one left no directory.
    final = int(reports[0]["final"])
    listed = {c.step: c.committed for c in checkpoint.list_checkpoints(root)}
    assert listed == dict.fromkeys([*written, final], True)
    managers = [checkpoint.CheckpointManager(root, rank=r, world_size=2, asynchronous=False) for r in (0, 1)]
    for step in [*written, final]:
        for r, manager in enumerate(managers):
            _, payload = manager.load(step)
            for i, tensor in enumerate(payload["tensors"].values()):
                assert torch.equal(tensor, torch.full_like(tensor, _value(step, r, i))), (step, r, i)
