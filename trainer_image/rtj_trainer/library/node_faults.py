"""Faults the trainer attributes to its node, reported to the operator (progress field ``nodeFaults``).

Some failures say more about the machine than about the program: a CUDA error such as an
uncorrectable ECC error or a GPU fallen off the bus, an NVML failure, an Xid, a GPU health check that
finds fewer GPUs than the node's ranks. Most leave the node Ready, so the operator would not move the
worker; the trainer tells it instead. Any rank that sees one appends a line to
``<checkpoint dir>/progress/node-faults/<node>.jsonl`` (``O_APPEND``: the ranks of a node share the
file, and it outlives in-process and in-job restarts and a pod replaced onto the same node); local
rank 0 puts the node's count and newest reason into its progress report (:meth:`NodeFaults.summary`),
and the operator treats the node as unhealthy from its ``trainerFaultThreshold`` on
(docs/operations.md, "Node health signals"). Errors a program makes on any machine (a device-side
assert, CUDA out of memory, a shape mismatch) are not the node's.

``NodeFaults`` is public (``rtj_trainer.NodeFaults``, docs/library.md): a script counts a fault it
caught inside its loop, or a failed GPU check, as ``rtj-train`` does, and the session's reports carry
it (they read the same file).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

# Error texts that blame the machine (GPU hardware, driver, NVML), case-insensitive.
NODE_FAULT_PATTERN: Final = re.compile(
    "|".join(
        (
            r"uncorrectable ECC error",
            r"\bECC error",
            r"\bXid\b",
            r"GPU is lost",
            r"fallen off the bus",
            r"unspecified launch failure",
            r"CUDA error: unknown error",
            r"no CUDA-capable device is detected",
            r"\bNVML(?:Error|_ERROR|\b.*\berror)",
            r"GPU health check",
        )
    ),
    re.IGNORECASE,
)
# Errors that mention CUDA but are the program's own.
PROGRAM_FAULT_PATTERN: Final = re.compile(r"device-side assert|out of memory", re.IGNORECASE)
MAX_REASON_CHARS: Final = 200
MAX_CHAIN: Final = 10


def node_fault_reason(error: BaseException | None) -> str | None:
    """The first line of the error (or of one it was raised from) that blames the node, else None."""
    seen = 0
    while error is not None and seen < MAX_CHAIN:
        text = f"{type(error).__name__}: {error}"
        if NODE_FAULT_PATTERN.search(text) and not PROGRAM_FAULT_PATTERN.search(text):
            first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
            return first[:MAX_REASON_CHARS]
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def gpu_check_problem(
    wanted: int,
    local_rank: int,
    *,
    available: Callable[[], bool],
    device_count: Callable[[], int],
    probe: Callable[[int], None],
) -> str | None:
    """A GPU health check before training: the GPUs the node's ranks need are visible, and this rank's
    own GPU answers (each rank probes only its own: a CUDA context on every GPU per rank would cost
    memory on all of them).

    None on a CPU-only run (no CUDA) or when the check passes, else why it failed. The torch calls are
    passed in (``torch.cuda.is_available``, ``device_count``, a small op on one device).
    """
    if wanted < 1 or not available():
        return None
    count = device_count()
    if count < wanted:
        return f"GPU health check: {count} of the {wanted} GPUs the node's ranks need are visible"
    try:
        probe(local_rank)
    except Exception as error:  # any failure of the probe is the device's
        text = f"GPU health check: GPU {local_rank} failed: {type(error).__name__}: {error}"
        return text[:MAX_REASON_CHARS]
    return None


def node_name(configured: str) -> str:
    """The node the faults are counted for: RTJ_NODE_NAME, else (outside Kubernetes) the host name."""
    return configured or socket.gethostname()


def _rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _probe_gpu(index: int) -> None:
    """A small computation on one GPU, waited for: raises when the device does not answer."""
    import torch

    torch.ones(1, device=torch.device("cuda", index)).add_(1).cpu()
    torch.cuda.synchronize(index)


class NodeFaults:
    """The node's fault lines, shared by its ranks (see the module's docstring); public as
    ``rtj_trainer.NodeFaults``. ``node``: the Kubernetes node (``JobSettings.node_name``); empty, the
    host name."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], node: str = "") -> None:
        self.node = node_name(node)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", self.node) or "node"
        self.path = Path(checkpoint_dir) / "progress" / "node-faults" / f"{safe}.jsonl"
        self._cached: tuple[tuple[int, int], dict[str, Any] | None] | None = None

    def record(self, reason: str, now: float | None = None) -> None:
        line = json.dumps({"node": self.node, "time": time.time() if now is None else now, "reason": reason})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def note(self, error: BaseException | None) -> str | None:
        """Count ``error`` against the node when it blames the node (:func:`node_fault_reason`, its
        causes included); returns the reason counted, else None."""
        reason = node_fault_reason(error)
        if reason is not None:
            self.record(reason)
        return reason

    def check_gpus(self, local_rank: int, *, wanted: int) -> str | None:
        """The GPU health check before training (:func:`gpu_check_problem`: ``wanted`` GPUs visible,
        GPU ``local_rank`` answers); a failure is counted against the node and returned, else None
        (also without CUDA)."""
        import torch

        problem = gpu_check_problem(
            wanted,
            local_rank,
            available=torch.cuda.is_available,
            device_count=torch.cuda.device_count,
            probe=_probe_gpu,
        )
        if problem is not None:
            self.record(problem)
        return problem

    def summary(self) -> dict[str, Any] | None:
        """``{"node", "count", "lastReason", "lastTime"}`` for the progress report; None when none."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        key = (stat.st_size, stat.st_mtime_ns)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        faults = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue  # a line being written by another rank
            if isinstance(item, dict) and item.get("node") == self.node:
                faults.append(item)
        result: dict[str, Any] | None = None
        if faults:
            last = faults[-1]
            result = {
                "node": self.node,
                "count": len(faults),
                "lastReason": str(last.get("reason", ""))[:MAX_REASON_CHARS],
                "lastTime": _rfc3339(float(last.get("time", 0.0))),
            }
        self._cached = (key, result)
        return result
