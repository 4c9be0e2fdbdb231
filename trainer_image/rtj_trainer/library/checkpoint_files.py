"""A checkpoint on the volume: its layout, the commit protocol, and what is read back and checked.

Plain file operations on ``$RTJ_CHECKPOINT_DIR``, without a writer process or a background thread:
the step directories with their shards, ``.done`` files and ``COMMITTED`` marker (the layout is in
``rtj_trainer.library.checkpoint``'s docstring), which of them are complete, the commit that makes a
step complete, pruning, and the checks against a shard's recorded size and CRC-32. The checkpoint
manager (``checkpoint``) and its collaborators (``checkpoint_writes``, ``checkpoint_commits``) call
these; ``checkpoint`` re-exports the names other modules and the tests use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch

log = logging.getLogger(__name__)

COMMIT_MARKER: Final = "COMMITTED"
# A checkpoint with a corrupt shard is renamed with this prefix (quarantine).
CORRUPT_PREFIX: Final = "corrupt-"
# How much of a shard is read at a time for its CRC-32.
_CRC_CHUNK_BYTES: Final = 8 << 20
_STEP_DIR = re.compile(r"^step-(\d+)$")
_DONE_FILE = re.compile(r"^rank-(\d+)\.done$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def shard_path(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.pt"


def done_path(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank:05d}.done"


def file_crc32(path: Path) -> tuple[int, int]:
    """(CRC-32, size in bytes) of the file: zlib's, a few GB/s, reading it in chunks."""
    crc, size = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(_CRC_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return crc, size


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    committed: bool
    world_size: int | None  # from the commit marker; None when not committed
    time: float | None


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Every step directory under ``root``, oldest first."""
    found: list[CheckpointInfo] = []
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        m = _STEP_DIR.match(entry.name)
        if not m or not entry.is_dir():
            continue
        world_size: int | None = None
        when: float | None = None
        committed = False
        marker = entry / COMMIT_MARKER
        if marker.is_file():
            try:
                meta = json.loads(marker.read_text())
                world_size = int(meta["worldSize"])
                when = float(meta["time"])
                committed = True
            except (OSError, ValueError, KeyError):
                committed = False
        found.append(CheckpointInfo(int(m.group(1)), entry, committed, world_size, when))
    return sorted(found, key=lambda c: c.step)


def newest_complete(root: Path, world_size: int | None = None) -> CheckpointInfo | None:
    """The newest committed checkpoint (of ``world_size`` ranks when given)."""
    for info in reversed(list_checkpoints(root)):
        if info.committed and (world_size is None or info.world_size == world_size):
            return info
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` committed checkpoints, and partial ones older than them.

    A partial directory newer than the newest commit may be a save in flight and is left alone.
    """
    infos = list_checkpoints(root)
    committed = [c for c in infos if c.committed]
    if not committed:
        return []
    kept = {c.step for c in committed[-keep:]}
    newest = committed[-1].step
    removed: list[Path] = []
    for info in infos:
        if info.step in kept or (not info.committed and info.step > newest):
            continue
        shutil.rmtree(info.path, ignore_errors=True)
        removed.append(info.path)
    return removed


def discard_partials_after(root: Path, step: int) -> list[Path]:
    """Delete the uncommitted directories newer than ``step``."""
    removed = []
    for info in list_checkpoints(root):
        if info.step > step and not info.committed:
            shutil.rmtree(info.path, ignore_errors=True)
            removed.append(info.path)
    return removed


def try_commit(root: Path, step: int, meta: Mapping[str, Any] | None = None) -> bool:
    """Write the commit marker if every rank's shard of ``step`` is durable. Idempotent."""
    directory = step_dir(root, step)
    if (directory / COMMIT_MARKER).is_file():
        return True
    if not directory.is_dir():
        return False
    world_size: int | None = None
    ranks: set[int] = set()
    for entry in directory.iterdir():
        m = _DONE_FILE.match(entry.name)
        if not m:
            continue
        try:
            done = json.loads(entry.read_text())
            world_size = int(done["worldSize"])
        except (OSError, ValueError, KeyError):
            continue
        ranks.add(int(m.group(1)))
    if world_size is None or ranks != set(range(world_size)):
        return False
    record = {"step": step, "worldSize": world_size, "time": time.time(), **(meta or {})}
    write_atomically(directory / COMMIT_MARKER, json.dumps(record))
    return True


def commit_ready(root: Path) -> list[int]:
    """Commit any directory whose shards are all durable (a committer died before writing the marker)."""
    return [c.step for c in list_checkpoints(root) if not c.committed and try_commit(root, c.step)]


def shard_payload(
    step: int, rank: int, world_size: int, tensors: Mapping[str, torch.Tensor], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """What a rank's shard file holds: its tensors, the caller's ``extra``, and whose shard it is."""
    return {
        "step": step,
        "rank": rank,
        "worldSize": world_size,
        "tensors": dict(tensors),
        "extra": dict(extra),
    }


def mark_done(root: Path, step: int, rank: int, world_size: int) -> None:
    """Write the rank's ``.done`` file of ``step``, with the size and CRC-32 of its shard as read back:
    the shard is durable, and a later read can be checked against them."""
    record: dict[str, Any] = {"rank": rank, "worldSize": world_size, "time": time.time()}
    try:
        record["crc32"], record["bytes"] = file_crc32(shard_path(root, step, rank))
        write_atomically(done_path(root, step, rank), json.dumps(record))
    except FileNotFoundError:
        # The directory was discarded (a resume chose an older checkpoint): nothing to mark.
        log.warning("checkpoint directory of step %d vanished before rank %d marked it", step, rank)


def shard_problem(root: Path, step: int, rank: int) -> str | None:
    """Why the rank's shard of ``step`` cannot be trusted, or None: its size and CRC-32 now, against
    what its ``.done`` recorded when it was written (a ``.done`` without them, written by a library
    before 0.4.0, is trusted)."""
    shard = shard_path(root, step, rank)
    try:
        record = json.loads(done_path(root, step, rank).read_text())
        if "crc32" not in record:
            return None
        crc, size = file_crc32(shard)
    except (OSError, ValueError) as error:
        return f"checkpoint shard {shard} of step {step} cannot be read: {error}"
    if (crc, size) != (record["crc32"], record.get("bytes")):
        return (
            f"checkpoint shard {shard} of step {step} is corrupt: CRC-32 {crc:08x} over {size} bytes, "
            f"written as {int(record['crc32']):08x} over {record.get('bytes')} bytes"
        )
    return None


def quarantine(root: Path, step: int) -> Path | None:
    """Set the checkpoint of ``step`` aside: renamed ``corrupt-step-...`` in place, no longer a
    checkpoint to resume from or to prune. None when it is gone already."""
    source = step_dir(root, step)
    target = source.with_name(f"{CORRUPT_PREFIX}{source.name}-{int(time.time())}")
    try:
        source.rename(target)
    except FileNotFoundError:
        return None
    fsync_dir(root)
    return target
