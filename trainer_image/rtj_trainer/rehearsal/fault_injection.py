"""Fault injection from ``RTJ_FAULTS``: rehearse each recovery layer on a real training run.

Format: faults separated by ``;``, each ``<kind>@<key>=<value>,...``::

    exception@step=30,rank=1;sigkill@step=60,rank=2;hang@step=90,rank=3;exception@p=0.01,seed=7

kinds: ``exception`` (a Python exception in the training step: the in-process layer recovers it),
``gpu-error`` (the same, with the text of a CUDA hardware error: the trainer also counts it as a
fault of its node, ``rtj_trainer.library.node_faults``),
``sigkill`` (the rank SIGKILLs itself: ft_launcher restarts the workers), ``hang`` (the rank sleeps
forever and stops sending heartbeats: the in-process hard timeout or ft_launcher's heartbeat
timeout, whichever is shorter, recovers it).
keys: ``step`` (fire when the step starts), or ``p`` (probability per step) with an optional
``seed`` (default 0); ``rank`` (global rank; several as ``rank=1+3``; default: every rank).

Each planned fault fires once across restarts: the rank claims a marker file under
``<checkpoint dir>/faults-fired/`` (exclusive create) before it fires, so a run resumed from a
checkpoint before the fault's step does not fire it again. For ``p`` faults the claim is per step.
The train loop (``rtj_trainer.reference.train``) calls :meth:`FaultInjector.maybe_fire` at the start of
every step; the marker's timestamp is also the fault time used for the recovery figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Final

KINDS: Final = ("exception", "gpu-error", "sigkill", "hang")


class FaultPlanError(ValueError):
    """RTJ_FAULTS does not parse."""


class InjectedFaultError(RuntimeError):
    """The exception an ``exception`` fault raises."""


class InjectedGpuError(InjectedFaultError):
    """The exception a ``gpu-error`` fault raises: worded as CUDA reports an uncorrectable ECC error."""


@dataclasses.dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    step: int | None = None
    probability: float | None = None
    seed: int = 0
    ranks: tuple[int, ...] | None = None  # None: every rank

    def applies_to(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def due(self, step: int, rank: int) -> bool:
        """Whether this fault is planned at ``step`` on ``rank`` (ignoring whether it already fired)."""
        if not self.applies_to(rank):
            return False
        if self.step is not None:
            return step == self.step
        assert self.probability is not None
        # Seeded per (seed, step, rank): the same run decides the same way on every attempt.
        draw = random.Random(f"{self.seed}:{step}:{rank}").random()
        return draw < self.probability


def parse_faults(text: str) -> tuple[Fault, ...]:
    faults: list[Fault] = []
    for index, item in enumerate(part.strip() for part in text.split(";")):
        if not item:
            continue
        kind, sep, rest = item.partition("@")
        kind = kind.strip()
        if not sep or kind not in KINDS:
            raise FaultPlanError(f"fault {item!r}: expected <kind>@<key>=<value>,... with kind in {KINDS}")
        step: int | None = None
        probability: float | None = None
        seed = 0
        ranks: tuple[int, ...] | None = None
        for pair in rest.split(","):
            key, eq, value = (s.strip() for s in pair.partition("="))
            if not eq or not value:
                raise FaultPlanError(f"fault {item!r}: {pair!r} is not key=value")
            try:
                if key == "step":
                    step = int(value)
                    if step < 0:
                        raise FaultPlanError(f"fault {item!r}: step must be >= 0")
                elif key == "p":
                    probability = float(value)
                    if not 0.0 <= probability <= 1.0:
                        raise FaultPlanError(f"fault {item!r}: p must be within [0, 1]")
                elif key == "seed":
                    seed = int(value)
                elif key == "rank":
                    ranks = tuple(sorted({int(r) for r in value.split("+")}))
                else:
                    raise FaultPlanError(f"fault {item!r}: unknown key {key!r}")
            except ValueError as err:
                if isinstance(err, FaultPlanError):
                    raise
                raise FaultPlanError(f"fault {item!r}: bad value for {key!r}: {value!r}") from err
        if (step is None) == (probability is None):
            raise FaultPlanError(f"fault {item!r}: give exactly one of step= or p=")
        faults.append(
            Fault(index=index, kind=kind, step=step, probability=probability, seed=seed, ranks=ranks)
        )
    return tuple(faults)


@dataclasses.dataclass(frozen=True)
class FiredFault:
    kind: str
    step: int
    rank: int
    time: float


class FaultInjector:
    """Fires the planned faults of one rank, each at most once across restarts."""

    def __init__(self, faults: tuple[Fault, ...], checkpoint_dir: str | os.PathLike[str], rank: int) -> None:
        self.faults = faults
        self.rank = rank
        self.marker_dir = Path(checkpoint_dir) / "faults-fired"

    def _marker(self, fault: Fault, step: int) -> Path:
        return self.marker_dir / f"fault-{fault.index}-step-{step}-rank-{self.rank}.json"

    def _claim(self, fault: Fault, step: int) -> bool:
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        record = {"kind": fault.kind, "step": step, "rank": self.rank, "time": time.time()}
        try:
            fd = os.open(self._marker(fault, step), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            # The marker must survive the SIGKILL that follows, or the fault would fire again.
            os.fsync(f.fileno())
        return True

    def maybe_fire(self, step: int) -> None:
        for fault in self.faults:
            if fault.due(step, self.rank) and self._claim(fault, step):
                fire(fault.kind, step, self.rank)

    def fired_since(self, since: float) -> list[FiredFault]:
        """Faults any rank fired after ``since`` (epoch seconds), oldest first."""
        fired: list[FiredFault] = []
        if not self.marker_dir.is_dir():
            return fired
        for path in self.marker_dir.glob("fault-*.json"):
            try:
                rec = json.loads(path.read_text())
                item = FiredFault(
                    kind=rec["kind"], step=int(rec["step"]), rank=int(rec["rank"]), time=rec["time"]
                )
            except (OSError, ValueError, KeyError):
                continue
            if item.time > since:
                fired.append(item)
        return sorted(fired, key=lambda f: f.time)


def fire(kind: str, step: int, rank: int) -> None:
    print(f"rtj-fault: injecting {kind} at step {step} on rank {rank}", flush=True)
    if kind == "exception":
        raise InjectedFaultError(f"injected exception at step {step} on rank {rank}")
    if kind == "gpu-error":
        raise InjectedGpuError(
            f"CUDA error: uncorrectable ECC error encountered (injected at step {step} on rank {rank})"
        )
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        # Sleep in long slices: the main thread stops pinging every watchdog, as a real hang would.
        while True:
            time.sleep(3600)
    raise FaultPlanError(f"unknown fault kind {kind!r}")
