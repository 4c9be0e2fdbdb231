"""Live progress of a rehearsal on the terminal.

On a TTY one line is redrawn in place (a bar, step/total, the job's state, restarts per layer); when
stdout is a pipe or a file (CI logs) a plain line is printed every `interval` seconds instead, and
whenever something changes that a reader should see (state, restarts, a fault injected), so logs stay
short but complete. Notes (a fault fired, a node killed) are always printed on their own line.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Snapshot:
    """What the progress line shows."""

    step: int = 0
    total: int = 0
    state: str = "Pending"
    restarts: dict[str, int] = field(default_factory=dict)
    checkpoint_step: int | None = None
    elapsed: float = 0.0

    def key(self) -> tuple[object, ...]:
        """What, when it changes, deserves a line even in a log."""
        return (self.state, tuple(sorted(self.restarts.items())), self.checkpoint_step)


def format_line(snap: Snapshot, *, width: int = 100, bar_width: int = 20) -> str:
    fraction = min(1.0, snap.step / snap.total) if snap.total else 0.0
    filled = round(fraction * bar_width)
    bar = "#" * filled + "." * (bar_width - filled)
    restarts = " ".join(f"{k} {v}" for k, v in snap.restarts.items()) or "none"
    ckpt = "-" if snap.checkpoint_step is None else str(snap.checkpoint_step)
    line = (
        f"[{bar}] step {snap.step}/{snap.total}  {snap.state:<10} restarts: {restarts}  "
        f"ckpt {ckpt}  {snap.elapsed:5.0f}s"
    )
    return line[:width]


class LiveLine:
    """Prints snapshots: in place on a TTY, periodically otherwise."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 10.0) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.interval = interval
        self._last_print = 0.0
        self._last_key: tuple[object, ...] | None = None
        self._drawn = False

    def update(self, snap: Snapshot) -> None:
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\x1b[2K" + format_line(snap, width=width))
            self.stream.flush()
            self._drawn = True
            return
        now = time.monotonic()
        if snap.key() != self._last_key or now - self._last_print >= self.interval:
            self.stream.write(format_line(snap, width=200) + "\n")
            self.stream.flush()
            self._last_print = now
            self._last_key = snap.key()

    def note(self, text: str) -> None:
        """A line of its own that stays above the live line."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._drawn = False

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
