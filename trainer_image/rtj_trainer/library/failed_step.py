"""The step a rank had done when its training failed, written where its launcher reads it.

When an exception ends a :class:`rtj_trainer.Session` block, the session adds a note to it
(PEP 678): ``rtj_trainer: failed after step <n>``. Python prints the note after the exception's own
line, so the traceback on the rank's stderr ends with both, and ``rtj-launch``, which keeps the last
lines of each rank's stderr (``rtj_trainer.runtime.rankshim``), learns at which step and how each try
failed: the same failure at the same step on consecutive tries is a deterministic failure
(``rtj_trainer.runtime.launcher_view.repeated_failure``), which no restart can mend.

Pure and standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

NOTE_PREFIX: Final = "rtj_trainer: failed after step "
_NOTE_LINE: Final = re.compile("^" + re.escape(NOTE_PREFIX) + r"(\d+)$")


def note(step: int) -> str:
    """The note for a failure after `step` steps were done (0: before the first)."""
    return f"{NOTE_PREFIX}{step}"


def add_note(error: BaseException, step: int) -> None:
    """Add the note to `error`, once (a re-raised exception keeps the first)."""
    notes = getattr(error, "__notes__", ())
    if not any(isinstance(n, str) and n.startswith(NOTE_PREFIX) for n in notes):
        error.add_note(note(step))


def step_in(lines: Iterable[str]) -> int | None:
    """The step of the last note among `lines` (stderr's last lines), or None without one."""
    found = None
    for line in lines:
        matched = _NOTE_LINE.match(line.strip())
        if matched is not None:
            found = int(matched.group(1))
    return found


def is_note(line: str) -> bool:
    return _NOTE_LINE.match(line.strip()) is not None
