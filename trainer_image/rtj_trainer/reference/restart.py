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

``rtj_trainer.reference.train`` rebuilds the process group, the FSDP model and RANK/WORLD_SIZE inside the
wrapped function. The wrapper itself is the library's public ``rtj_trainer.wrap_in_process``, which
keeps the differences between NVRx releases out of here (the keyword arguments each accepts, the
NVML checks before a restart); what this module adds is ``rtj-train``'s own configuration.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import torch

import rtj_trainer
from rtj_trainer.reference.interrupt import MainThreadWaker, reassign, shutdown_tcp_sockets

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
# NVRx's in-process layer, which NVRx 0.6 deprecated: a release without it stops here, with the
# fallback in the error (rtj_trainer.library.nvrx_inprocess). What needs nothing of it is in `interrupt`.
inprocess: Any = rtj_trainer.in_process_layer()


class AbortProcessGroup(inprocess.abort.Abort):  # type: ignore[misc]
    """Abort that works on gloo (socket shutdown) and NCCL, and always destroys the group; then
    wakes a main thread blocked outside Python so the restart reaches it."""

    def __init__(self, keep_ports: Collection[int], waker: MainThreadWaker | None = None) -> None:
        self.keep_ports = tuple(keep_ports)
        self.waker = waker

    def __call__(self, state: Any) -> Any:
        try:
            return self._abort(state)
        finally:
            if self.waker is not None:
                self.waker.start()

    def _abort(self, state: Any) -> Any:
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


class ReplaceFromReserve(inprocess.rank_assignment.RankAssignment):  # type: ignore[misc]
    """NVRx rank assignment of the supervisor's fixed world: ``reassign``; active ranks call the
    training function, reserve ranks wait inside the wrapper."""

    def __init__(self, active_world_size: int) -> None:
        self.active = active_world_size

    def __call__(self, ctx: Any) -> Any:
        Mode = inprocess.state.Mode  # noqa: N806 - NVRx's enum, by its name
        state = ctx.state
        if state.rank in ctx.terminated_ranks:
            raise inprocess.rank_assignment.RankDiscarded(f"rank={state.rank} terminated")
        rank, world_size = reassign(state.rank, state.world_size, ctx.terminated_ranks, self.active)
        if rank < self.active:
            mode, active_rank, active_world = Mode.ACTIVE, rank, self.active
        else:
            mode, active_rank, active_world = Mode.INACTIVE, None, self.active
        ctx.state = dataclasses.replace(
            state,
            rank=rank,
            world_size=world_size,
            mode=mode,
            active_rank=active_rank,
            active_world_size=active_world,
        )
        ctx.terminated_ranks = set()
        return ctx


class StoreClient(inprocess.store.TCPStore):  # type: ignore[misc]
    """The wrapper's store as a client of the store pod: no rank hosts it, none is critical to it."""

    TCP_STORE_HOST_RANK = -1

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return ()

    def termination_barrier(self, ranks: Collection[Any], **kwargs: Any) -> Any:
        """NVRx's barrier with ranks as integers: its sibling monitor passes the initial ranks of a
        lost node's ranks as the store's bytes (b"0"), which the barrier writes as "b'0'" and every
        later reader of the barrier fails to parse (measured on 0.4.1 and 0.7.0: every surviving
        rank then failed at the end of the training)."""
        return self.reentrant_barrier(
            ranks=[int(rank) for rank in ranks], group_name=self.TERMINATION_BARRIER, **kwargs
        )


def restartable(
    fn: Callable[[Any], int],
    env: rtj_trainer.JobSettings,
    *,
    store_host: str,
    store_port: int,
    keep_ports: Collection[int],
    waker: MainThreadWaker | None = None,
    active_world_size: int | None = None,
) -> Callable[[], int]:
    """``fn`` under the configured ``inprocess.Wrapper`` (disabled when ``RTJ_INPROCESS_ENABLED=false``):
    calling the result runs ``fn(call_wrapper)`` until it returns, restarting it in this interpreter
    after a fault; ``call_wrapper`` is NVRx's ``CallWrapper`` (None when disabled).

    With ``active_world_size`` (supervisor mode) the world holds reserve ranks past it, the stores
    live in the store pod and a terminated rank is replaced by a reserve rank (``reassign``)."""
    soft = env.inprocess_soft_timeout_seconds
    hard = max(env.inprocess_hard_timeout_seconds, soft + 1)
    barrier = max(env.inprocess_barrier_timeout_seconds, hard + 1)
    heartbeat_timeout = min(30.0, barrier - 1, max(soft - 1, 2.0))
    seconds = dt.timedelta
    health_check = inprocess.Compose(
        inprocess.health_check.CudaHealthCheck(seconds(seconds=min(30.0, soft))),
        IterationBudget(env.inprocess_max_iterations),
    )
    store_kwargs: dict[str, Any] = {
        "host_name": store_host,
        "port": store_port,
        "timeout": seconds(seconds=barrier),
    }
    requested: dict[str, Any] = {
        "store_kwargs": store_kwargs,
        "abort": AbortProcessGroup(keep_ports, waker),
        "health_check": health_check,
        "monitor_thread_interval": seconds(seconds=0.1),
        # Below the progress watchdog interval: hang detection needs it (measured).
        "monitor_process_interval": seconds(seconds=0.2),
        # Also how long a reserve rank's wait may delay its restart (the barrier waits for it).
        "progress_watchdog_interval": seconds(seconds=0.25),
        # The sibling monitor declares a silent rank (its node lost) unresponsive after the timeout.
        "heartbeat_interval": seconds(seconds=0.5),
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
    if active_world_size is not None:
        store_kwargs["wait_for_workers"] = False
        requested["store_factory"] = StoreClient
        requested["rank_assignment"] = ReplaceFromReserve(active_world_size)
    return rtj_trainer.wrap_in_process(fn, **requested)
