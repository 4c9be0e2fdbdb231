"""One log line per failure class, with a count: what `rtj operator` logs while the API server is
unreachable.

During an API outage every watch retries, every health check fails and every pass that writes fails
again; each retry logged a line (kopf's "Request attempt #3/9 failed; will retry ..."), some with a
traceback. `RepeatedFailures` is a filter on each of the operator's log handlers: a warning or error
whose failure class (the exception's type, or the one its message names: `ConnectTimeoutError(...)`)
the same logger logged within `window_seconds` is held back and counted. Once the window is over, the
count goes out as one line of its own ("kopf._cogs.clients.watching: 12 more ConnectTimeoutError in
the last 60 s"), written with the next record the handler gets, and that class's next failure is
logged again. The first of a class is logged whole, traceback included: a bug's first traceback
stays readable. Records below WARNING and records that name no failure pass untouched.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# A failure named in a message: an exception's class and the "(" of its repr.
NAMED_FAILURE = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Timeout|Refused|Unavailable))\(")
DEFAULT_WINDOW_SECONDS = 60.0


def failure_class(record: logging.LogRecord) -> str | None:
    """The class of the failure a record reports: its exception's type, else the last exception
    class its message names; None for a record that reports no failure."""
    if record.exc_info and record.exc_info[0] is not None:
        return record.exc_info[0].__name__
    named = NAMED_FAILURE.findall(record.getMessage())
    return named[-1] if named else None


@dataclass
class _Run:
    """A failure class's window: when its first record was logged, and how many were held back."""

    started: float
    held_back: int = 0


class RepeatedFailures(logging.Filter):
    """Holds back a failure class's repeats within a window and counts them (see the module)."""

    def __init__(
        self,
        handler: logging.Handler,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.handler = handler
        self.window_seconds = window_seconds
        self._clock = clock
        self._runs: dict[tuple[str, str], _Run] = {}
        self._lock = threading.Lock()  # the operator logs from worker threads too

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        kind = failure_class(record) if record.levelno >= logging.WARNING else None
        with self._lock:
            ended = self._end_runs(now)
            passes = kind is None or self._first_of_run((record.name, kind), now)
        for key, run in ended:
            self.handler.handle(_count_record(key, run, now, record))
        return passes

    def _end_runs(self, now: float) -> list[tuple[tuple[str, str], _Run]]:
        """Forget the runs whose window is over; those that held records back, to be counted."""
        ended = [key for key, run in self._runs.items() if now - run.started >= self.window_seconds]
        runs = [(key, self._runs.pop(key)) for key in ended]
        return [(key, run) for key, run in runs if run.held_back]

    def _first_of_run(self, key: tuple[str, str], now: float) -> bool:
        """Whether a failure of `key` starts a run (logged), else it is held back and counted."""
        run = self._runs.get(key)
        if run is None:
            self._runs[key] = _Run(started=now)
            return True
        run.held_back += 1
        return False


def _count_record(
    key: tuple[str, str], run: _Run, now: float, current: logging.LogRecord
) -> logging.LogRecord:
    """One line saying how many failures of a class were held back (it names no failure itself)."""
    name, kind = key
    return logging.LogRecord(
        name=name,
        level=logging.WARNING,
        pathname=current.pathname,
        lineno=0,
        msg="%d more %s in the last %.0f s",
        args=(run.held_back, kind, now - run.started),
        exc_info=None,
    )


def install(logger: logging.Logger | None = None) -> list[RepeatedFailures]:
    """Put a `RepeatedFailures` on every handler of `logger` (the root logger by default)."""
    target = logger if logger is not None else logging.getLogger()
    filters = [RepeatedFailures(handler) for handler in target.handlers]
    for handler, repeated in zip(target.handlers, filters, strict=True):
        handler.addFilter(repeated)
    return filters
