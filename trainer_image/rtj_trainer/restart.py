"""In-process restart: the NVRx ``inprocess.Wrapper`` around the training function.

The wrapper restarts the training function in the same interpreter on every rank when any rank
raises, times out or stops pinging. What makes that fast and safe here:

* The abort frees ranks blocked in a collective. NCCL groups are aborted by NVRx's own abort. Gloo
  has no abort: a rank stuck in a gloo collective waits for the process-group timeout. Shutting down
  (``SHUT_RDWR``) the process's established TCP sockets, except the stores', makes the collective
  fail at once; ``destroy_process_group`` then always runs, because a group left alive makes the
  next iteration fail ("initialize the default process group twice").
* A health check enforces the fault budget (``RTJ_INPROCESS_MAX_ITERATIONS``); a failing check ends
  the process, and ft_launcher takes over (in-job restart). NVRx 0.7.0 adds NVML GPU/NVLink/NIC
  checks before each restart; they stay on GPU nodes and are dropped without CUDA (nvrx_compat).
* Timeouts come from the environment contract. The monitor intervals are short, since recovery
  cannot be faster than the wrapper notices the fault.

``rtj_trainer.train`` rebuilds the process group, the FSDP model and RANK/WORLD_SIZE inside the
wrapped function; ``rtj_trainer.nvrx_compat`` filters the keyword arguments by NVRx release.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import socket
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import torch
from nvidia_resiliency_ext import inprocess

from rtj_trainer.env import TrainerEnv
from rtj_trainer.nvrx_compat import limit_restart_health_check, wrapper_kwargs

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


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


class AbortProcessGroup(inprocess.abort.Abort):  # type: ignore[misc]
    """Abort that works on gloo (socket shutdown) and NCCL, and always destroys the group."""

    def __init__(self, keep_ports: Collection[int]) -> None:
        self.keep_ports = tuple(keep_ports)

    def __call__(self, state: Any) -> Any:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return state
        try:
            if torch.distributed.get_backend() == "nccl":
                inprocess.abort.AbortTorchDistributed.shutdown_all_process_group_backends()
            else:
                shut = shutdown_tcp_sockets(self.keep_ports)
                log.debug("abort: shut down %d gloo connections", shut)
        finally:
            torch.distributed.destroy_process_group()
        return state


class IterationBudgetExceededError(RuntimeError):
    """More in-process restarts than RTJ_INPROCESS_MAX_ITERATIONS allows."""


class IterationBudget(inprocess.health_check.HealthCheck):  # type: ignore[misc]
    """Fails once ``max_iterations`` in-process attempts were used: the fault goes up a layer."""

    def __init__(self, max_iterations: int) -> None:
        self.max_iterations = max_iterations

    def __call__(self, state: Any) -> Any:
        if state.fn_exception is not None and state.iteration + 1 >= self.max_iterations:
            raise IterationBudgetExceededError(
                f"in-process restart budget of {self.max_iterations} iterations used"
            )
        return state


def make_wrapper(env: TrainerEnv, *, store_host: str, store_port: int, keep_ports: Collection[int]) -> Any:
    """The configured ``inprocess.Wrapper`` (disabled when ``RTJ_INPROCESS_ENABLED=false``)."""
    soft = env.inprocess_soft_timeout_seconds
    hard = max(env.inprocess_hard_timeout_seconds, soft + 1)
    barrier = max(env.inprocess_barrier_timeout_seconds, hard + 1)
    heartbeat_timeout = min(30.0, barrier - 1, max(soft - 1, 2.0))
    seconds = dt.timedelta
    health_check = inprocess.Compose(
        inprocess.health_check.CudaHealthCheck(seconds(seconds=min(30.0, soft))),
        IterationBudget(env.inprocess_max_iterations),
    )
    requested: dict[str, Any] = {
        "store_kwargs": {
            "host_name": store_host,
            "port": store_port,
            "timeout": seconds(seconds=barrier),
        },
        "abort": AbortProcessGroup(keep_ports),
        "health_check": health_check,
        "monitor_thread_interval": seconds(seconds=0.1),
        # Below the progress watchdog interval: hang detection needs it (measured).
        "monitor_process_interval": seconds(seconds=0.5),
        "progress_watchdog_interval": seconds(seconds=1),
        "heartbeat_interval": seconds(seconds=1),
        "heartbeat_timeout": seconds(seconds=heartbeat_timeout),
        "soft_timeout": seconds(seconds=soft),
        "hard_timeout": seconds(seconds=hard),
        "barrier_timeout": seconds(seconds=barrier),
        "completion_timeout": seconds(seconds=barrier),
        # How long the wrapper waits for other ranks' concurrent faults before restarting: short,
        # since each fault restarts every rank anyway.
        "last_call_wait": seconds(seconds=0.1),
        "enabled": env.inprocess_enabled,
    }
    wrapper = inprocess.Wrapper(**wrapper_kwargs(requested))
    limit_restart_health_check(wrapper, health_check, cuda=torch.cuda.is_available())
    return wrapper
