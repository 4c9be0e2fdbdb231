"""``python -m rtj_trainer.runtime.rankshim -- <command...>``: what ft_launcher runs for each rank.

``rtj-launch`` puts this shim in front of the training command (``rtj_trainer.runtime.launch``), so that the
pod learns about its ranks without the training script doing anything for it: a script written
against NVRx's public API alone (``RankMonitorClient`` heartbeats) gets its restarts counted, its
recoveries timed and, when the job declares a log-line pattern, its step and loss reported. The shim

* runs the command as its child, in a process group of its own, and makes it die with the shim
  (``PR_SET_PDEATHSIG``); it forwards SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 to that group (ft_launcher
  signals the shim's group, as it signalled the rank's own before) and exits with the child's status
  (128 + the signal when a signal killed it);
* passes the child's stdout and stderr through, whole lines at a time, to its own (the container's
  log reads the same as without it); the child gets ``PYTHONUNBUFFERED=1`` unless the user set it;
* searches each output line for ``RTJ_STEP_LOG_PATTERN`` (:func:`compile_step_pattern`);
* keeps a small JSON record of the rank in ``RTJ_RANKS_DIR/rank-<LOCAL_RANK>-<pid>.json`` (the
  directory set by ``rtj-launch``), replaced atomically (:class:`RankRecord`): ``rtj-launch`` reads
  these files to build the launcher view (``rtj_trainer.runtime.launcher_view``).

Standard library only, and nothing of ``rtj_trainer`` (whose ``__init__`` and ``runtime/__init__``
import nothing either): a rank's start costs one small interpreter, and the file can ship on its own.
Without ``RTJ_RANKS_DIR`` it only runs the command (no record is kept).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final

# Set by rtj-launch for its children: the directory of the rank records (a fresh one per pod).
RANKS_DIR_ENV: Final = "RTJ_RANKS_DIR"
# Rendered from spec.progress.stepLogPattern; rtj_trainer.library.env names it in the environment
# contract (a test keeps the two names equal).
STEP_LOG_PATTERN_ENV: Final = "RTJ_STEP_LOG_PATTERN"
# Set by ft_launcher (torchelastic) for each worker: the worker group's restarts so far.
RESTART_COUNT_ENV: Final = "TORCHELASTIC_RESTART_COUNT"
LOCAL_RANK_ENV: Final = "LOCAL_RANK"
MODULE: Final = "rtj_trainer.runtime.rankshim"
RECORD_PREFIX: Final = "rank-"
RECORD_SUFFIX: Final = ".json"

FORWARDED_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# Step records are written at most this often (the first match and the exit record at once): a
# rank printing a line per step costs a file write every half second at most.
WRITE_INTERVAL_SECONDS: Final = 0.5
# What the record keeps of stderr: the newest lines that are not blank, each clipped.
ERROR_LINES: Final = 5
ERROR_LINE_CHARS: Final = 300
# A line longer than this is passed on (and searched) in pieces rather than held back.
MAX_LINE_BYTES: Final = 65536
# After the child ended, the shim passes on what is left of its output until the pipes are closed
# or stay empty this long (a helper process of the command may hold them open: the shim does not
# wait for it, so that ft_launcher learns of the rank's end at once), and at most
# OUTPUT_DRAIN_SECONDS (a helper that keeps writing).
OUTPUT_IDLE_SECONDS: Final = 0.2
OUTPUT_DRAIN_SECONDS: Final = 2.0
# Exit statuses of a command that could not be started, as a shell reports them.
NOT_EXECUTABLE_EXIT_CODE: Final = 126
NOT_FOUND_EXIT_CODE: Final = 127
_PR_SET_PDEATHSIG: Final = 1


def command(python: str) -> list[str]:
    """The argv prefix that runs the shim under `python`; the user's command follows it."""
    return [python, "-m", MODULE, "--"]


def record_name(local_rank: int, pid: int) -> str:
    """One file per process: a rank's record outlives the next generation's start, so rtj-launch reads
    every generation's end however late it looks (a loaded machine delays its reads)."""
    return f"{RECORD_PREFIX}{local_rank}-{pid}{RECORD_SUFFIX}"


def record_local_rank(name: str) -> int | None:
    """The local rank of the record file `name`, or None when `name` is not one."""
    if not (name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)):
        return None
    local_rank, _, pid = name[len(RECORD_PREFIX) : -len(RECORD_SUFFIX)].partition("-")
    return int(local_rank) if local_rank.isdigit() and pid.isdigit() else None


def compile_step_pattern(pattern: str) -> re.Pattern[str]:
    """``RTJ_STEP_LOG_PATTERN`` compiled; ValueError when it is not a Python regular expression with a
    group named ``step`` or at least one group (the step is that group, else the first)."""
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise ValueError(f"{pattern!r} is not a Python regular expression: {err}") from err
    if "step" not in compiled.groupindex and compiled.groups == 0:
        raise ValueError(f"{pattern!r} has no group for the step: name one (?P<step>...), or add a group")
    return compiled


def match_step(pattern: re.Pattern[str], line: str) -> tuple[int, float | None] | None:
    """(step, loss or None) when `pattern` is found in `line` and its step group holds an integer;
    the loss is the group named ``loss``, when there is one and it holds a finite number."""
    found = pattern.search(line)
    if found is None:
        return None
    raw_step = found.group("step") if "step" in pattern.groupindex else found.group(1)
    try:
        step = int(raw_step)
    except (TypeError, ValueError):
        return None
    loss: float | None = None
    if "loss" in pattern.groupindex:
        with contextlib.suppress(TypeError, ValueError):
            loss = float(found.group("loss"))
        if loss is not None and not math.isfinite(loss):
            loss = None
    return step, loss


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + the signal that killed it."""
    return 128 - returncode if returncode < 0 else returncode


class RankRecord:
    """What the shim knows about its rank, written to ``<dir>/rank-<local rank>-<pid>.json``.

    Fields: ``pid`` (the shim's), ``startEpoch`` (when the command started), ``restartCount``
    (``TORCHELASTIC_RESTART_COUNT``, 0 when absent), ``step``/``loss``/``stepEpoch`` (the last line
    the pattern matched, or null), ``firstStep``/``firstStepEpoch`` (the first such line of this
    process, or null), ``exitCode``/``endEpoch`` (null while running) and ``lastErrorLines``. Every
    write replaces the file atomically; step writes are throttled (:data:`WRITE_INTERVAL_SECONDS`)
    but for the first match and the exit record. Thread-safe: both output pumps report to it.
    """

    def __init__(self, path: Path | None, *, pid: int, start_epoch: float, restart_count: int) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._errors: deque[str] = deque(maxlen=ERROR_LINES)
        self._fields: dict[str, Any] = {
            "pid": pid,
            "startEpoch": start_epoch,
            "restartCount": restart_count,
            "step": None,
            "loss": None,
            "stepEpoch": None,
            "firstStep": None,
            "firstStepEpoch": None,
            "exitCode": None,
            "endEpoch": None,
            "lastErrorLines": [],
        }
        self._written_at = float("-inf")
        self._dirty = True
        self._warned = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, start_epoch: float) -> RankRecord:
        directory = environ.get(RANKS_DIR_ENV, "")
        local_rank = _int_or(environ.get(LOCAL_RANK_ENV), 0)
        path = Path(directory) / record_name(local_rank, os.getpid()) if directory else None
        restart_count = _int_or(environ.get(RESTART_COUNT_ENV), 0)
        return cls(path, pid=os.getpid(), start_epoch=start_epoch, restart_count=restart_count)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self._fields, "lastErrorLines": list(self._errors)}

    def started(self, epoch: float) -> None:
        with self._lock:
            self._fields["startEpoch"] = epoch
            self._write_locked(epoch)

    def step_seen(self, step: int, loss: float | None, epoch: float) -> None:
        with self._lock:
            first = self._fields["firstStepEpoch"] is None
            self._fields.update(step=step, loss=loss, stepEpoch=epoch)
            if first:
                self._fields.update(firstStep=step, firstStepEpoch=epoch)
            self._dirty = True
            if first or epoch - self._written_at >= WRITE_INTERVAL_SECONDS:
                self._write_locked(epoch)

    def error_line(self, line: str) -> None:
        text = line.strip()
        if not text:
            return
        with self._lock:
            self._errors.append(text[:ERROR_LINE_CHARS])
            self._dirty = True

    def flush(self, epoch: float) -> None:
        """Write what changed since the last write, when the throttle allows."""
        with self._lock:
            if self._dirty and epoch - self._written_at >= WRITE_INTERVAL_SECONDS:
                self._write_locked(epoch)

    def ended(self, status: int, epoch: float) -> None:
        with self._lock:
            self._fields.update(exitCode=status, endEpoch=epoch)
            self._write_locked(epoch)

    def _write_locked(self, epoch: float) -> None:
        self._written_at, self._dirty = epoch, False
        if self.path is None:
            return
        body = json.dumps({**self._fields, "lastErrorLines": list(self._errors)}, separators=(",", ":"))
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(body)
            os.replace(tmp, self.path)
        except OSError as err:
            # The record is advisory: a vanished directory must not stop the rank.
            if not self._warned:
                self._warned = True
                _say(f"rankshim: rank record {self.path} not written: {err}")


def _int_or(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode(errors="replace"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:
            return  # a closed log: the child's output is still drained, so it never blocks
        view = view[written:]


def pump(source: int, target: int, on_line: Callable[[str], None], done: threading.Event) -> None:
    """Copy `source` to `target` until EOF, or until `done` is set and `source` stays empty for
    OUTPUT_IDLE_SECONDS, a whole line (or carriage-return update) at a time, calling `on_line` with
    each non-empty line."""
    pending = b""
    while True:
        readable, _, _ = select.select([source], [], [], OUTPUT_IDLE_SECONDS)
        if not readable:
            if done.is_set():
                break
            continue
        try:
            chunk = os.read(source, MAX_LINE_BYTES)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
        if cut == 0 and len(pending) >= MAX_LINE_BYTES:
            cut = len(pending)
        if cut:
            complete, pending = pending[:cut], pending[cut:]
            _write_all(target, complete)
            _lines_to(complete, on_line)
    if pending:
        _write_all(target, pending)
        _lines_to(pending, on_line)


def _lines_to(data: bytes, on_line: Callable[[str], None]) -> None:
    for raw in data.splitlines():
        if raw.strip():
            on_line(raw.decode("utf-8", errors="replace"))


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the shim dies (it is in a group of its own, so a
    kill of the shim's group would otherwise leave it running)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Forwarder:
    """Forwards the signals to the child's process group, also one that came before it existed."""

    def __init__(self) -> None:
        self.child_group: int | None = None
        self.early: list[int] = []

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.child_group is None:
            self.early.append(signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child_group, signum)

    def adopt(self, child_group: int) -> None:
        self.child_group = child_group
        for signum in self.early:
            self.handle(signum, None)


def _line_handler(
    record: RankRecord, pattern: re.Pattern[str] | None, *, stderr: bool
) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if stderr:
            record.error_line(line)
        if pattern is not None:
            matched = match_step(pattern, line)
            if matched is not None:
                record.step_seen(matched[0], matched[1], time.time())

    return on_line


def _pattern(environ: Mapping[str, str]) -> re.Pattern[str] | None:
    raw = environ.get(STEP_LOG_PATTERN_ENV, "")
    if not raw:
        return None
    try:
        return compile_step_pattern(raw)
    except ValueError as err:
        # rtj-launch rejects a bad pattern before it starts anything: this is a shim run by hand.
        _say(f"rankshim: {STEP_LOG_PATTERN_ENV} ignored: {err}")
        return None


def run(args: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run `args` under the shim; returns the exit status for the shim."""
    record = RankRecord.from_environ(environ, start_epoch=time.time())
    pattern = _pattern(environ)
    forwarder = _Forwarder()
    forwarder.install()
    child_env = dict(environ)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        child = subprocess.Popen(
            list(args),
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - no thread runs yet
        )
    except OSError as err:
        status = NOT_FOUND_EXIT_CODE if isinstance(err, FileNotFoundError) else NOT_EXECUTABLE_EXIT_CODE
        message = f"rankshim: cannot run {args[0]!r}: {err.strerror or err}"
        _say(message)
        record.error_line(message)
        record.ended(status, time.time())
        return status
    record.started(time.time())
    forwarder.adopt(child.pid)
    assert child.stdout is not None and child.stderr is not None
    child_ended = threading.Event()
    pumps = [
        threading.Thread(
            target=pump,
            args=(child.stdout.fileno(), 1, _line_handler(record, pattern, stderr=False), child_ended),
            name="rankshim-stdout",
            daemon=True,
        ),
        threading.Thread(
            target=pump,
            args=(child.stderr.fileno(), 2, _line_handler(record, pattern, stderr=True), child_ended),
            name="rankshim-stderr",
            daemon=True,
        ),
    ]
    for thread in pumps:
        thread.start()
    while True:
        try:
            returncode = child.wait(timeout=WRITE_INTERVAL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            record.flush(time.time())
    end = time.time()
    child_ended.set()
    deadline = time.monotonic() + OUTPUT_DRAIN_SECONDS
    for thread in pumps:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    status = exit_status(returncode)
    record.ended(status, end)  # with the last error lines, timed when the command ended
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        _say(f"usage: python -m {MODULE} -- <command...>")
        return 2
    return run(args, os.environ)


if __name__ == "__main__":
    sys.exit(main())
