"""Supervisor mode's ranks forked from ``rtj-launch`` after it imported torch once, not each started
afresh: one import of torch (and of the training program's modules) per pod instead of one per rank.

Every rank of a Supervisor job is a Python program of the pod's own interpreter (the in-process
wrapper needs the library), and its start is mostly imports: torch, NVRx's in-process layer, the
program's own modules, 2-3 CPU-seconds a rank. A p5 pod starts 8 ranks at once, every one reading
the same files (on a shared file system, 8 x the nodes at once); the local cluster's 2 cores start a
whole job's. So ``rtj-launch`` imports them once, before it starts any thread of its own, and forks
the ranks: each child gets the parent's imported modules, then becomes the program as ``python
script ...`` or ``python -m module ...`` would run it (its environment, ``sys.argv``, ``__main__``,
default signal handlers, no inherited logging handlers or exit functions, its own session) and ends
with the program's exit status. NVRx forks its own monitor process from each rank after the same
imports, so nothing here asks more of torch than NVRx already does.

A command that is not a Python program of this interpreter (another interpreter, a binary, a
wrapper script) runs as a new process, as it always did (:func:`program_of` says None); so does any
command with ``RTJ_FORK_RANKS=0``. ``RTJ_PRELOAD_MODULES`` (comma-separated) names more modules to
import before the fork.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import logging
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger("rtj_trainer.runtime.forked")

# "0" runs every rank as a new process (no fork).
FORK_RANKS_ENV: Final = "RTJ_FORK_RANKS"
# Modules to import before the ranks are forked, besides torch and the program's own entry module.
PRELOAD_MODULES_ENV: Final = "RTJ_PRELOAD_MODULES"
# Imported before every fork: what every Supervisor rank imports first, and torch's compiler front end,
# which torch imports at a program's first backward pass (0.6 CPU-seconds a rank, measured).
ALWAYS_PRELOADED: Final = ("torch", "torch.distributed", "torch._dynamo")
# How long a script's first line may be to be read as its interpreter line.
_SHEBANG_LIMIT: Final = 512


@dataclass(frozen=True)
class Program:
    """A command as a Python program of this interpreter: a script's path or a module's name, and
    the ``sys.argv`` it runs with."""

    target: str
    argv: tuple[str, ...]
    module: bool = False


def _same_file(a: str, b: str) -> bool:
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return False


def _interpreter_line(path: str) -> str | None:
    """The interpreter a script names on its first line (``#!/path/python``), if it does."""
    try:
        with open(path, "rb") as script:
            first = script.readline(_SHEBANG_LIMIT)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return words[0] if len(words) == 1 else None


def program_of(command: Sequence[str], python: str = sys.executable) -> Program | None:
    """`command` as a Python program of the interpreter `python`, or None where it is something else
    (then it runs as a new process): ``python script.py ...``, ``python -m module ...``, or a script
    whose first line names `python` (a console script of the same environment, such as rtj-train)."""
    if not command:
        return None
    head, rest = command[0], list(command[1:])
    if _same_file(head, python):
        if len(rest) >= 2 and rest[0] == "-m":
            return Program(target=rest[1], argv=(rest[1], *rest[2:]), module=True)
        if rest and not rest[0].startswith("-") and Path(rest[0]).is_file():
            return Program(target=rest[0], argv=tuple(rest))
        return None  # interpreter options, -c, or no script: not ours to mimic
    interpreter = _interpreter_line(head)
    if interpreter is not None and _same_file(interpreter, python):
        return Program(target=head, argv=(head, *rest))
    return None


def entry_module(program: Program) -> str | None:
    """The module a console script of this environment runs (rtj-train: rtj_trainer.reference.train),
    which holds its ``main``. None for ``python -m module`` and ``python script.py``: their top-level
    code is the program, which must run once, as ``__main__``, in each rank."""
    if program.module:
        return None
    name = Path(program.target).name
    for entry in importlib.metadata.entry_points(group="console_scripts", name=name):
        return entry.module
    return None


def preload(program: Program, environ: Mapping[str, str]) -> list[str]:
    """Import what the ranks will import first; returns the modules imported. A module that cannot be
    imported is only logged: the rank imports it again and meets the error itself."""
    extra = [m.strip() for m in environ.get(PRELOAD_MODULES_ENV, "").split(",") if m.strip()]
    entry = entry_module(program)
    loaded = []
    for name in [*ALWAYS_PRELOADED, *([entry] if entry else []), *extra]:
        try:
            importlib.import_module(name)
        except KeyboardInterrupt:
            raise
        except BaseException as err:
            # An import that fails or exits is the rank's to meet, as a new process's would be.
            log.warning("could not preload %s (%r): the ranks import it themselves", name, err)
            continue
        loaded.append(name)
    return loaded


def fork_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(FORK_RANKS_ENV, "1") != "0"


class ForkedRank:
    """A rank forked by :func:`spawn`, as much of ``subprocess.Popen`` as rtj-launch uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N for a signal, as Popen
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    program: Program, env: Mapping[str, str], *, preexec: Callable[[], None] | None = None
) -> ForkedRank:
    """Fork a rank that runs `program` with `env` in its own session; never returns in the child.
    SIGTERM and SIGINT wait while it forks: the child must not run rtj-launch's handlers for them."""
    sys.stdout.flush()
    sys.stderr.flush()
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    pid = os.fork()
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        return ForkedRank(pid)
    code = 1
    try:
        code = _become(program, env, preexec, held)
    finally:
        os._exit(code)


def _become(
    program: Program, env: Mapping[str, str], preexec: Callable[[], None] | None, held: set[signal.Signals]
) -> int:
    """In the child: the state a new ``python`` process would have, then the program; its status."""
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    if preexec is not None:
        preexec()
    os.environ.clear()
    os.environ.update(env)
    _forget_parent_state()
    sys.argv = list(program.argv)
    code = _run(program)
    _shut_down()
    return code


def _forget_parent_state() -> None:
    """What rtj-launch set up that a new interpreter would not have: its logging handlers (the
    program configures its own) and its exit functions; numpy's global generator is reseeded, as a
    new process seeds it afresh (Python's own ``random`` reseeds itself after a fork)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    atexit._clear()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run(program: Program) -> int:
    try:
        if program.module:
            runpy.run_module(program.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(program.target, run_name="__main__")
    except SystemExit as done:
        return _exit_status(done.code)
    except BaseException:  # as the interpreter does: print it, status 1
        traceback.print_exc()
        return 1
    return 0


def _exit_status(code: object) -> int:
    """``sys.exit(code)``'s status, as the interpreter turns it into one."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _shut_down() -> None:
    """What the interpreter does at exit: wait for the program's non-daemon threads, run its exit
    functions, flush its output."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def spawner(program: Program, preexec: Callable[[], None] | None) -> Callable[[dict[str, str]], ForkedRank]:
    """A spawn function for :func:`rtj_trainer.runtime.supervisor.run_forwarding_drain`."""

    def start(env: dict[str, str]) -> ForkedRank:
        return spawn(program, env, preexec=preexec)

    return start


__all__ = [
    "ALWAYS_PRELOADED",
    "FORK_RANKS_ENV",
    "PRELOAD_MODULES_ENV",
    "ForkedRank",
    "Program",
    "entry_module",
    "fork_enabled",
    "preload",
    "program_of",
    "spawn",
    "spawner",
]
