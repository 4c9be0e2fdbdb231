"""`rtj bench checkpoint`: what checkpoint saves cost a training loop, synchronous against async.

For each state size and checkpoint interval it runs the same loop three times, in one process: no
saves (the baseline), synchronous saves and async saves, all through the trainer's own
`rtj_trainer.library.checkpoint.CheckpointManager` (the code that runs in the job: per-rank shard, fsync,
done file, commit marker). Async saves run as the trainer drives them: every save point copies the
state into host memory on a background thread (the memory tier), overlapping the next step, and the
loop calls `wait_staged()` before it changes the state in place; the copy is written by NVRx's writer
process when the writer is free (`ready_to_write()`), otherwise the save point is skipped and the
durable checkpoint stays at most one write behind. It reports:

- training efficiency = time spent in steps / wall time of the loop (the AWS sample's measure); the
  wait for the last save to be durable after the loop is reported apart (`final_flush_seconds`);
- blocking time per save point (the save call, plus the wait for its copy before the next update),
  split into waiting for the copy and waiting for the writer, against the floor: a plain in-memory
  copy of the same state into a preallocated buffer;
- saves written and skipped, and how far the newest committed checkpoint was behind at a save point.

A step is emulated by `--step-seconds` of sleep plus an in-place update of the state: it stands for
an accelerator-bound step, where the host thread waits on the GPU while the copy thread and the
writer process have the CPU. Real training steps are measured by the goodput benchmark and the
trainer's own benchmark.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

TENSOR_MB = 4  # state is split into tensors of this size, like the parameters of a real model


def synthetic_state(megabytes: int) -> dict[str, torch.Tensor]:
    """`megabytes` MiB of float32 tensors, seeded so every run saves the same bytes."""
    gen = torch.Generator().manual_seed(0)
    n = max(1, megabytes // TENSOR_MB)
    numel = TENSOR_MB * 1024 * 1024 // 4
    return {f"layer{i}.weight": torch.randn(numel, generator=gen) for i in range(n)}


def copy_floor_seconds(state: dict[str, torch.Tensor], repeats: int = 7) -> float:
    """Median time of a plain copy of `state` into preallocated buffers (the least a save can block).
    The first copies fault the buffers' pages in and start torch's threads: they are not timed."""
    buffers = {k: torch.empty_like(v) for k, v in state.items()}
    times = []
    for _ in range(3):
        for k, v in state.items():
            buffers[k].copy_(v)
    for _ in range(repeats):
        started = time.perf_counter()
        for k, v in state.items():
            buffers[k].copy_(v)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@dataclass
class LoopResult:
    mode: str  # none | Sync | Async
    size_mb: int
    interval: int
    steps: int
    saves: int  # save points
    saves_written: int  # durable saves
    saves_skipped: int  # Async: save points that found the writer busy, kept in host memory only
    wall_seconds: float
    step_seconds: float  # time inside steps
    efficiency: float
    blocking_mean_seconds: float  # per save point: the save call plus the wait for its copy
    blocking_max_seconds: float
    copy_wait_mean_seconds: float  # part of the blocking: the copy had not finished by the next update
    writer_wait_mean_seconds: float  # part of the blocking: no staging buffer free of the writer
    durable_lag_max_steps: int  # at a save point, how far the newest committed checkpoint was behind
    copy_floor_seconds: float
    final_flush_seconds: float  # waiting for the last save to be durable, after the loop


@dataclass
class _SavePoints:
    blocking: list[float]
    copy_waits: list[float]
    writer_waits: list[float]
    lags: list[int]


def _manager(root: Path, mode: str, state: dict[str, torch.Tensor]) -> Any:
    from rtj_trainer.library.checkpoint import CheckpointManager

    if mode == "none":
        return None
    asynchronous = mode == "Async"
    manager = CheckpointManager(
        root / mode, rank=0, world_size=1, asynchronous=asynchronous, keep=2, stage_in_background=asynchronous
    )
    # A warm-up, not timed: the first async save starts NVRx's writer process (seconds), and a second
    # one while the writer is busy allocates the second staging buffer; both buffers go through the
    # writer once. One-off costs per training process.
    manager.save(0, state, {"step": 0})
    if asynchronous:
        manager.wait_staged()
        manager.save(0, state, {"step": 0})
        manager.wait_staged()
    manager.wait(timeout=None)
    manager.poll()
    return manager


def _save_point(manager: Any, step: int, state: dict[str, torch.Tensor], points: _SavePoints) -> None:
    # Write only when the writer is free: a save point that finds it busy copies the state into host
    # memory (the memory tier) and the durable checkpoint stays at most one write behind.
    write = manager.ready_to_write()
    committed = manager.last_committed
    points.lags.append(step - (committed.step if committed is not None else 0))
    writer_waited = manager.stats.total_writer_wait_seconds
    manager.save(step, state, {"step": step}, write=write)
    points.blocking.append(manager.stats.last_blocking_seconds)
    points.writer_waits.append(manager.stats.total_writer_wait_seconds - writer_waited)
    points.copy_waits.append(0.0)


def run_loop(
    state: dict[str, torch.Tensor],
    *,
    mode: str,
    interval: int,
    steps: int,
    step_seconds: float,
    root: Path,
    floor: float,
    size_mb: int,
) -> LoopResult:
    manager = _manager(root, mode, state)
    points = _SavePoints([], [], [], [])
    in_steps = 0.0
    started = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            time.sleep(step_seconds)
            in_steps += time.perf_counter() - t0
            if manager is not None:
                # The state changes next, as in opt.step(): the last save's copy must be complete.
                manager.wait_staged()
                if points.copy_waits and manager.stats.last_copy_wait_seconds > 0:
                    points.copy_waits[-1] += manager.stats.last_copy_wait_seconds
                    points.blocking[-1] += manager.stats.last_copy_wait_seconds
            t1 = time.perf_counter()
            # Every step changes the state, as an optimizer step does: a save must copy it.
            for tensor in state.values():
                tensor[:1024].add_(1.0)
            in_steps += time.perf_counter() - t1
            if manager is not None:
                if step % interval == 0:
                    _save_point(manager, step, state, points)
                manager.poll()
        wall = time.perf_counter() - started
        flush_started = time.perf_counter()
        if manager is not None:
            # The last save must be durable before the run ends; timed apart from the loop, as a
            # one-off cost at the end of training that a long run amortizes.
            manager.wait_staged()
            manager.wait(timeout=None)
            manager.poll()
        flush = time.perf_counter() - flush_started
    finally:
        if manager is not None:
            manager.close()
    stats = manager.stats if manager is not None else None
    warm_up_saves = 2 if mode == "Async" else 1
    return LoopResult(
        mode=mode,
        size_mb=size_mb,
        interval=interval,
        steps=steps,
        saves=len(points.blocking),
        saves_written=stats.saves - warm_up_saves if stats is not None else 0,
        saves_skipped=stats.skipped if stats is not None else 0,
        wall_seconds=wall,
        step_seconds=in_steps,
        efficiency=in_steps / wall,
        blocking_mean_seconds=_mean(points.blocking),
        blocking_max_seconds=max(points.blocking, default=0.0),
        copy_wait_mean_seconds=_mean(points.copy_waits),
        writer_wait_mean_seconds=_mean(points.writer_waits),
        durable_lag_max_steps=max(points.lags, default=0),
        copy_floor_seconds=floor,
        final_flush_seconds=flush,
    )


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def run(
    sizes_mb: Sequence[int],
    intervals: Sequence[int],
    *,
    step_seconds: float,
    saves_per_run: int,
    log: Any = print,
) -> list[LoopResult]:
    """The whole sweep; each (size, interval) runs no saves, Sync and Async back to back."""
    results: list[LoopResult] = []
    with tempfile.TemporaryDirectory(prefix="rtj-ckpt-bench-") as tmp:
        for size in sizes_mb:
            state = synthetic_state(size)
            floor = copy_floor_seconds(state)
            for interval in intervals:
                steps = interval * saves_per_run
                for mode in ("none", "Sync", "Async"):
                    result = run_loop(
                        state,
                        mode=mode,
                        interval=interval,
                        steps=steps,
                        step_seconds=step_seconds,
                        root=Path(tmp) / f"{size}-{interval}",
                        floor=floor,
                        size_mb=size,
                    )
                    results.append(result)
                    log(
                        f"  {size:>5} MiB every {interval:>3} steps {mode:>5}: efficiency "
                        f"{result.efficiency:6.1%}, "
                        f"blocking {result.blocking_mean_seconds * 1000:8.1f} ms/save"
                    )
    return results


def format_table(results: Sequence[LoopResult]) -> str:
    header = (
        f"{'state':>8} {'every':>6} {'sync eff':>9} {'async eff':>9} {'sync block':>11} "
        f"{'async block':>12} {'(copy)':>9} {'(writer)':>9} {'written/skipped':>16} {'lag':>5} "
        f"{'copy floor':>11}"
    )
    lines = [header, "-" * len(header)]
    by_key: dict[tuple[int, int], dict[str, LoopResult]] = {}
    for r in results:
        by_key.setdefault((r.size_mb, r.interval), {})[r.mode] = r
    for (size, interval), modes in sorted(by_key.items()):
        sync, asyn = modes.get("Sync"), modes.get("Async")
        if sync is None or asyn is None:
            continue
        lines.append(
            f"{size:>5} MiB {interval:>6} {sync.efficiency:>9.1%} {asyn.efficiency:>9.1%} "
            f"{sync.blocking_mean_seconds * 1000:>8.1f} ms {asyn.blocking_mean_seconds * 1000:>9.1f} ms "
            f"{asyn.copy_wait_mean_seconds * 1000:>6.1f} ms {asyn.writer_wait_mean_seconds * 1000:>6.1f} ms "
            f"{asyn.saves_written:>8}/{asyn.saves_skipped:<7} {asyn.durable_lag_max_steps:>5} "
            f"{asyn.copy_floor_seconds * 1000:>8.1f} ms"
        )
    return "\n".join(lines)


def to_json(results: Sequence[LoopResult], settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "checkpoint",
        "settings": settings,
        # 1, 5 and 15-minute load averages at the end: the copy and the writer compete for the cores.
        "load_average": list(os.getloadavg()),
        "results": [asdict(r) for r in results],
    }
