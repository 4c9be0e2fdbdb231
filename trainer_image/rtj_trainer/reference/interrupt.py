"""What an in-process restart needs that comes from no NVRx release: the socket shutdown that frees
ranks blocked in a gloo collective, the signal that wakes a main thread blocked outside Python so the
restart reaches it, and the Supervisor world's rank arithmetic (``reassign``). ``restart`` builds
NVRx's abort and rank assignment on these; ``train`` uses the waker and the world's error without
importing NVRx's in-process layer, so that ``rtj-train`` with in-process restart off runs on a
release that no longer has it (``rtj_trainer.library.nvrx_inprocess``).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Collection
from typing import Final


def shutdown_tcp_sockets(keep_ports: Collection[int]) -> int:
    """Shut down this process's established TCP connections, except those touching ``keep_ports``.

    The file descriptors stay open (their owner, gloo, closes them); only the connection is cut, so
    every blocked send/recv on them returns an error. Returns how many were shut down.
    """
    import psutil

    count = 0
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.status != psutil.CONN_ESTABLISHED or conn.fd < 0:
            continue
        ports = {conn.laddr.port if conn.laddr else -1, conn.raddr.port if conn.raddr else -1}
        if ports & set(keep_ports):
            continue
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=conn.fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
            finally:
                sock.detach()
    return count


# The signal that wakes the main thread out of a blocking call so that NVRx's asynchronous
# RankShouldRestart, which only lands while Python code runs, reaches a rank that sleeps or waits in
# a system call (a hang the soft timeout caught while the process is still alive).
WAKE_SIGNAL: Final = signal.SIGUSR2
WAKE_INTERVAL_SECONDS: Final = 0.05
WAKE_LIMIT_SECONDS: Final = 5.0


def _ignore_wake_up(_signum: int, _frame: object) -> None:
    """Runs Python code in the main thread: the pending asynchronous exception is raised here."""


class MainThreadWaker:
    """Signals the main thread every 50 ms, from the abort until the restart is delivered."""

    def __init__(self) -> None:
        self._delivered = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def install() -> None:
        """From the main thread, before the wrapper runs: the handler that makes a wake-up harmless."""
        signal.signal(WAKE_SIGNAL, _ignore_wake_up)
        signal.siginterrupt(WAKE_SIGNAL, False)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._delivered.clear()
        self._thread = threading.Thread(target=self._wake, name="rtj-wake-main", daemon=True)
        self._thread.start()

    def delivered(self) -> None:
        """The main thread has the restart (it reached the next iteration or an exception handler)."""
        self._delivered.set()

    def _wake(self) -> None:
        main = threading.main_thread().ident
        if main is None:
            return
        deadline = WAKE_LIMIT_SECONDS / WAKE_INTERVAL_SECONDS
        count = 0
        while not self._delivered.wait(WAKE_INTERVAL_SECONDS) and count < deadline:
            with contextlib.suppress(OSError, ProcessLookupError):
                signal.pthread_kill(main, WAKE_SIGNAL)
            count += 1


class WorldBrokenError(RuntimeError):
    """A terminated active rank and no reserve rank left to take its index: the world cannot go on."""


def reassign(rank: int, world_size: int, terminated: Collection[int], active: int) -> tuple[int, int]:
    """The next rank and world size of ``rank`` after ``terminated`` ranks left the world.

    Active ranks (below ``active``) keep their index, so their state stays theirs; each terminated
    active index goes to the lowest healthy reserve rank, in order; the remaining reserve ranks
    close up behind the active ones. Raises WorldBrokenError when the reserve runs out.
    """
    gone = set(terminated)
    if rank in gone:
        raise ValueError(f"rank {rank} is terminated")
    gaps = sorted(r for r in gone if r < active)
    reserve = sorted(r for r in range(active, world_size) if r not in gone)
    if len(reserve) < len(gaps):
        raise WorldBrokenError(
            f"{len(gaps)} active rank(s) {gaps} lost and {len(reserve)} reserve rank(s) left"
        )
    if rank < active:
        return rank, world_size - len(gone)
    position = reserve.index(rank)
    if position < len(gaps):
        return gaps[position], world_size - len(gone)
    return active + position - len(gaps), world_size - len(gone)
