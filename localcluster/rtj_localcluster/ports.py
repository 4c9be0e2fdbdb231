"""Loopback ports that stay free until their holder binds them: the control plane's components, the
test suite's operators, rendezvous stores.

Binding port 0 and closing the probe hands out an *ephemeral* port: the kernel gives the same range
to every outgoing connection, and to every other process probing the same way, so between the
probe and the component's own bind the port can be taken ("address already in use"). A port from
here comes from below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which no
outgoing connection uses, and is claimed with a lock file (``/tmp/rtj-ports/<port>.lock``,
``flock``) that its claimant holds until :meth:`PortClaim.release` or its exit: two clusters, two
test workers or two probes in one process never get the same port.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Machine-wide (not per user): every process on the machine shares the loopback ports.
PORT_LOCK_DIR = Path("/tmp/rtj-ports")
FIRST_PORT = 20000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768

_lock = threading.Lock()
_cursor = {"next": 0}
"""Where this process's next search starts, as an offset into the range."""


def ephemeral_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The first port the kernel hands to outgoing connections (32768 where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(range_file.read_text().split()[0])
    return DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def shared_lock_dir(path: Path) -> None:
    """Create ``path`` for locks that every user's processes take (not only umask's modes)."""
    with contextlib.suppress(OSError):
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o1777)


def try_lock(path: Path) -> int | None:
    """An open descriptor of ``path`` holding its ``flock`` (it goes with the descriptor, or the
    process), or None where another holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@dataclass
class PortClaim:
    """Ports this process holds; each stays claimed until :meth:`release` (or the process exits)."""

    lock_dir: Path = PORT_LOCK_DIR
    _fds: dict[int, int] = field(default_factory=dict)

    @property
    def ports(self) -> list[int]:
        return list(self._fds)

    def take(self, preferred: int = 0) -> int:
        """``preferred`` where it is free and unclaimed (a port kept from an earlier start), else the
        next free, unclaimed port below the ephemeral range."""
        shared_lock_dir(self.lock_dir)
        if preferred and self._claim(preferred):
            return preferred
        high = ephemeral_low()
        for port in self._candidates(high):
            if self._claim(port):
                _advance_cursor(port)
                return port
        raise RuntimeError(
            f"no free loopback port in {FIRST_PORT}-{high - 1}: all are bound or claimed in {self.lock_dir}"
        )

    def take_pair(self) -> int:
        """A port P with P + 1 free and unclaimed too (servers that listen on two neighbours)."""
        shared_lock_dir(self.lock_dir)
        high = ephemeral_low()
        for port in self._candidates(high):
            if port + 1 < high and self._claim(port):
                if self._claim(port + 1):
                    _advance_cursor(port + 1)
                    return port
                self._drop(port)
        raise RuntimeError(f"no two neighbouring free loopback ports below {high}")

    def release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def _drop(self, port: int) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fds.pop(port))

    def _claim(self, port: int) -> bool:
        if port in self._fds:
            return False
        fd = try_lock(self.lock_dir / f"{port}.lock")
        if fd is None:
            return False
        if not _bindable(port):
            os.close(fd)
            return False
        self._fds[port] = fd
        return True

    @staticmethod
    def _candidates(high: int) -> Iterator[int]:
        """Every port from FIRST_PORT below ``high`` once, starting after the last one this process
        handed out (a port released a moment ago is tried last: its holder may still be closing it)."""
        low = FIRST_PORT
        with _lock:
            start = _cursor["next"]
        for offset in range(high - low):
            yield low + (start + offset) % (high - low)


def _advance_cursor(port: int) -> None:
    with _lock:
        _cursor["next"] = port + 1 - FIRST_PORT


_process_claim = PortClaim()


def reserve_port() -> int:
    """A loopback port that stays this process's for its lifetime: for a server started later,
    by this process or a child it starts."""
    return _process_claim.take()


def reserve_port_pair() -> int:
    """A port P such that P and P + 1 stay this process's for its lifetime."""
    return _process_claim.take_pair()
