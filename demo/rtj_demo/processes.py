"""Finding the processes a rehearsal started, so it can prove it left none behind.

A rehearsal starts many processes: the operator, the local cluster's pod processes (ft_launcher
agents, training ranks, NVRx monitor processes, async checkpoint writers). Some outlive their
parents by design (a SIGKILLed rank's checkpoint writer is re-parented to init), so walking the
demo's own process tree is not enough. Instead the demo tags its environment with a run id before it
starts anything; every process started from it inherits the tag (the kubelet passes the host's
environment on to pod processes), and `tagged_processes` finds them all by that tag, whoever their
parent is now, without touching other users' or other runs' processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from types import FrameType

import psutil

RUN_TAG = "RTJ_DEMO_RUN_ID"


def clean_up_on_sigterm() -> None:
    """SIGTERM (a `timeout`, a CI job cancelled, `kill`) unwinds the run as Ctrl-C does, through its
    clean-up: by default it would end this process at once and leave its local cluster, operator
    and pods running."""

    def unwind(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


def tag_environment() -> str:
    """Give this process (and so every process it starts) a run id; return it. An id already in the
    environment is kept, so whoever started the demo (a test) can check for leftovers itself."""
    run_id = os.environ.get(RUN_TAG) or uuid.uuid4().hex
    os.environ[RUN_TAG] = run_id
    return run_id


def tagged_processes(run_id: str) -> list[psutil.Process]:
    """Live processes (other than this one) whose environment carries `run_id`."""
    me = os.getpid()
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["pid", "uids"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            # Zombies have no environment left, and reading another user's fails: neither is ours.
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(RUN_TAG) == run_id:
                found.append(proc)
    return found


def describe(procs: list[psutil.Process]) -> str:
    parts = []
    for proc in procs:
        try:
            cmd = " ".join(proc.cmdline())[:120]
        except psutil.Error:
            cmd = "?"
        parts.append(f"pid {proc.pid}: {cmd}")
    return "; ".join(parts)


def reap(run_id: str, *, timeout: float = 15.0) -> list[psutil.Process]:
    """Wait up to `timeout` s for the run's processes to exit by themselves, then SIGKILL the rest.

    Returns the processes that had to be killed: an empty list means the run cleaned up after itself.
    """
    deadline = time.monotonic() + timeout
    left = tagged_processes(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = tagged_processes(run_id)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=5)
    return left
