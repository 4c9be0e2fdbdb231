"""`rtj bench checkpoint`: what checkpoint saves cost a training loop, synchronous against async.

For each state size and checkpoint interval it runs the same loop three times, in one process: no
saves (the baseline), synchronous saves and async saves, all through the trainer's own
`rtj_trainer.checkpoint.CheckpointManager` (the code that runs in the job: per-rank shard, fsync,
done file, commit marker; async saves stage into shared memory and hand off to NVRx's writer
process). It reports:

- training efficiency = time spent in steps / wall time of the loop (the AWS sample's measure); the
  wait for the last save to be durable after the loop is reported apart (`final_flush_seconds`);
- blocking time per save (how long `save()` holds the loop) against the floor: a plain in-memory
  copy of the same state into a preallocated buffer, the least any consistent save must block.

A step is emulated by `--step-seconds` of sleep plus an in-place update of the state: it stands for
an accelerator-bound step, where the host thread waits on the GPU while the writer process has the
CPU. Real training steps are measured by the goodput benchmark and the trainer's own benchmark.
"""

from __future__ import annotations

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
    saves: int
    wall_seconds: float
    step_seconds: float  # time inside steps
    efficiency: float
    blocking_mean_seconds: float
    blocking_max_seconds: float
    waiting_previous_mean_seconds: float  # part of the blocking spent waiting for the previous write
    copy_floor_seconds: float
    final_flush_seconds: float  # waiting for the last save to be durable, after the loop


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
    from rtj_trainer.checkpoint import CheckpointManager

    manager = None
    if mode != "none":
        manager = CheckpointManager(root / mode, rank=0, world_size=1, asynchronous=mode == "Async", keep=2)
        # A warm-up save, not timed: the first async save starts NVRx's writer process (seconds),
        # a one-off cost per training process rather than per save.
        manager.save(0, state, {"step": 0})
        manager.wait(timeout=None)
        manager.poll()
    blocking: list[float] = []
    waits: list[float] = []
    in_steps = 0.0
    started = time.perf_counter()
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            time.sleep(step_seconds)
            # Every step changes the state, as an optimizer step does: a save must copy it.
            for tensor in state.values():
                tensor[:1024].add_(1.0)
            in_steps += time.perf_counter() - t0
            if manager is not None:
                if step % interval == 0:
                    # Split the blocking: waiting for the previous write (the interval was shorter
                    # than a write) and the save call itself (the copy into staging, or the write).
                    t1 = time.perf_counter()
                    manager.wait(timeout=None)
                    waited = time.perf_counter() - t1
                    manager.save(step, state, {"step": step})
                    waits.append(waited)
                    blocking.append(waited + manager.stats.last_blocking_seconds)
                manager.poll()
        wall = time.perf_counter() - started
        flush_started = time.perf_counter()
        if manager is not None:
            # The last save must be durable before the run ends; timed apart from the loop, as a
            # one-off cost at the end of training that a long run amortizes.
            manager.wait(timeout=None)
            manager.poll()
        flush = time.perf_counter() - flush_started
    finally:
        if manager is not None:
            manager.close()
    return LoopResult(
        mode=mode,
        size_mb=size_mb,
        interval=interval,
        steps=steps,
        saves=len(blocking),
        wall_seconds=wall,
        step_seconds=in_steps,
        efficiency=in_steps / wall,
        blocking_mean_seconds=statistics.fmean(blocking) if blocking else 0.0,
        blocking_max_seconds=max(blocking, default=0.0),
        waiting_previous_mean_seconds=statistics.fmean(waits) if waits else 0.0,
        copy_floor_seconds=floor,
        final_flush_seconds=flush,
    )


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
        f"{'async block':>12} {'(waiting)':>10} {'copy floor':>11}"
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
            f"{asyn.waiting_previous_mean_seconds * 1000:>7.1f} ms {asyn.copy_floor_seconds * 1000:>8.1f} ms"
        )
    return "\n".join(lines)


def to_json(results: Sequence[LoopResult], settings: dict[str, Any]) -> dict[str, Any]:
    return {"benchmark": "checkpoint", "settings": settings, "results": [asdict(r) for r in results]}
