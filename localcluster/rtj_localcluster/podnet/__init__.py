"""Each pod's own "all addresses": the LD_PRELOAD library of ``podnet.c``, built and found here.

Pods share the machine's network namespace; the library (see ``podnet.c``) turns a bind of the
wildcard address into a bind of the pod's IP, so two pods (of one local cluster, or of two) listen
on the same port without colliding. ``make setup`` builds it (``python -m rtj_localcluster.podnet``)
with the C compiler (``$CC`` or ``cc``) into ``<cache>/podnet-<hash of the source>.so`` (the cache of
the control-plane programs, ``~/.cache/rtj``); a cluster that starts without it builds it then.
Where there is no compiler, or ``RTJ_LOCAL_PODNET=0``, :func:`library` says why not and pods bind
the machine's real addresses (the kubelet then checks declared ``containerPorts`` itself).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..binaries import cache_dir
from ..ports import shared_lock_dir, try_lock

SOURCE = Path(__file__).resolve().parent / "podnet.c"
DISABLE_ENV = "RTJ_LOCAL_PODNET"
POD_IP_ENV = "RTJ_POD_IP"
# Machine-wide (not per user or per cache): clusters of every user share the loopback addresses.
BLOCK_LOCK_DIR = Path("/tmp/rtj-pod-ip-blocks")


@dataclass(frozen=True)
class PodNet:
    """The library's path, or None with the reason it is not there."""

    path: Path | None
    reason: str = ""


def target() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return cache_dir() / f"podnet-{digest}.so"


def build() -> Path:
    """Compile the library into the cache (once per source version); raises RuntimeError if it cannot."""
    path = target()
    if path.is_file():
        return path
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler ({compiler!r} is not on PATH; set CC)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        command = [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl"]
        try:
            subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"{' '.join(command)} failed: {error.stderr.strip()}") from error
        except (OSError, subprocess.SubprocessError) as error:
            raise RuntimeError(f"{' '.join(command)} failed: {error}") from error
        os.replace(out, path)
    return path


@functools.cache
def library() -> PodNet:
    """The library for this machine (built on first use), or why pods go without it."""
    if os.environ.get(DISABLE_ENV, "1").lower() in ("0", "false", "no", "off"):
        return PodNet(None, f"{DISABLE_ENV}={os.environ[DISABLE_ENV]}")
    try:
        return PodNet(build())
    except RuntimeError as error:
        return PodNet(None, str(error))


def container_env(env: dict[str, str], pod_ip: str) -> None:
    """Put the library (first in ``LD_PRELOAD``) and the pod IP into a container's environment."""
    lib = library().path
    if lib is None:
        return
    env[POD_IP_ENV] = pod_ip
    existing = [p for p in env.get("LD_PRELOAD", "").split() if p and p != str(lib)]
    env["LD_PRELOAD"] = " ".join([str(lib), *existing])


# The environment mark of a pod's processes that names the pod's controller (its owner's uid).
OWNER_ENV = "RTJ_LOCAL_POD_OWNER"


def _listeners(port: int) -> list[str | None]:
    """For each process listening on TCP ``port``: its pod's owner mark ("" for a process outside
    any pod; None when the process cannot be read)."""
    owners: list[str | None] = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        try:
            owners.append(psutil.Process(conn.pid).environ().get(OWNER_ENV, "") if conn.pid else None)
        except (psutil.Error, OSError):
            owners.append(None)
    return owners


def taken_ports(container: Mapping[str, Any], owner: str) -> list[int]:
    """The container's declared TCP ``containerPorts`` that a process of the machine already listens
    on (on all addresses or on any one): what a container without the library cannot bind. A port
    held only by pods of the same ``owner`` (worker 0 of the job holding the rendezvous port that
    every worker declares) is not counted."""
    taken = []
    for item in container.get("ports") or []:
        port = int(item.get("containerPort") or 0)
        if not port or (item.get("protocol") or "TCP") != "TCP":
            continue
        with socket.socket() as probe:
            # SO_REUSEADDR: only a listening socket makes the bind fail, not connections in TIME_WAIT.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
                continue
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    continue
        holders = _listeners(port)
        if not holders or any(holder != owner for holder in holders):
            taken.append(port)
    return taken


class IpAllocator:
    """Distinct loopback pod IPs 127.b.x.y (x >= 1: 127.0.0.x is left to the host's services).

    ``b`` is a block of the machine that the cluster holds while it runs: the first of 0..255 whose
    lock file (``/tmp/rtj-pod-ip-blocks/<b>.lock``, ``flock``) no other cluster holds, so two local
    clusters on one machine, in one process or in two, never hand out the same address. The lock
    goes with the process (or :meth:`release`).
    """

    def __init__(self, lock_dir: Path = BLOCK_LOCK_DIR) -> None:
        self._next = 0
        self._lock_dir = lock_dir
        self._lock_fd: int | None = None
        self.block: int | None = None

    def _claim(self) -> int:
        shared_lock_dir(self._lock_dir)
        for block in range(256):
            fd = try_lock(self._lock_dir / f"{block}.lock")
            if fd is not None:
                self._lock_fd = fd
                return block
        raise RuntimeError(f"no free block of pod IPs: 256 local clusters hold the locks in {self._lock_dir}")

    def allocate(self) -> str:
        if self.block is None:
            self.block = self._claim()
        index = self._next
        self._next += 1
        return f"127.{self.block}.{1 + index // 254}.{1 + index % 254}"

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = None
        self.block = None
        self._next = 0
