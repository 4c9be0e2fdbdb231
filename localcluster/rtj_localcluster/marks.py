"""Finding the local cluster's processes by the marks in their environment, as a runtime finds a
container's processes by its cgroup: launchers (torch elastic) move workers into new sessions, so a
process group does not hold them all. Used for pods' containers (``kubelet``), a cluster's pods
(``cluster``) and its control plane (``controlplane``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping

import psutil


def signal_matching(sig: int, matches: Callable[[Mapping[str, str]], bool]) -> int:
    """Send ``sig`` to every process whose environment ``matches``; returns how many."""
    count = 0
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if not matches(env):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)
            count += 1
    return count
