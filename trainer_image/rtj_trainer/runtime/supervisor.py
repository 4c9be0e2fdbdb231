"""``rtj-launch`` in supervisor mode: the pod's ranks as its own children, in one fixed world.

Every pod of the job, workers and hot spares alike, starts ``RTJ_NPROC_PER_NODE`` rank processes
with global ranks ``slot * nproc + local rank`` in a world of ``slots * nproc`` ranks, of which the
first ``nnodes * nproc`` are active and the rest are NVRx reserve ranks (torch imported, waiting
inside the in-process wrapper). The world's stores live in the job's store pod
(``rtj_trainer.runtime.store``). There is no ft_launcher and no torchelastic rendezvous: a rank that
dies, or a node that is lost, is replaced in-process by a reserve rank
(``rtj_trainer.reference.interrupt.reassign``), and the surviving ranks' processes go on. So this
supervisor does not restart anything: one rank's death leaves its siblings running. The pod's exit
status: 0 once every local rank has ended and one of them finished the training; otherwise the first
failure's (the operator then restarts the job: a world that can no longer go on, for instance with
no reserve rank left, ends every rank with ``WORLD_BROKEN_EXIT_CODE``; the ranks and this
supervisor share it and the store keys through ``rtj_trainer.library.world``).

A pod that starts after the world formed (the replacement of a lost pod: the store holds
``WORLD_FORMED_KEY``) cannot join it, since NVRx's world is fixed at its start; it holds its node as
a standby until the operator deletes it or the job ends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from rtj_contract.stores import PG_STORE_OFFSET, WRAPPER_STORE_OFFSET

from rtj_trainer.library import drain
from rtj_trainer.library.env import ACTIVE_WORLD_SIZE, GROUPS_STORE_PORT, WRAPPER_STORE_PORT, TrainerEnv
from rtj_trainer.library.world import (
    WORLD_BROKEN_EXIT_CODE,
    WORLD_FINISHED_KEY,
    WORLD_FORMED_KEY,
)

log = logging.getLogger("rtj_trainer.runtime.supervisor")

POLL_SECONDS: Final = 0.2


class Child(Protocol):
    """A rank or launcher process: a ``subprocess.Popen``, or a rank forked after the imports
    (``rtj_trainer.runtime.forked.ForkedRank``)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def send_signal(self, signum: int) -> None: ...

    def kill(self) -> None: ...


def rank_environments(env: TrainerEnv, base: dict[str, str], store_address: str) -> list[dict[str, str]]:
    """The environment of each local rank process (pure)."""
    nproc = env.nproc_per_node
    world = env.slots * nproc
    out = []
    for local_rank in range(nproc):
        out.append(
            {
                **base,
                "RANK": str(env.slot * nproc + local_rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": str(env.slot),
                "MASTER_ADDR": store_address,
                "MASTER_PORT": str(env.store_port),
                # The store pod serves the world's two stores (rtj_trainer.runtime.store).
                WRAPPER_STORE_PORT: str(env.store_port + WRAPPER_STORE_OFFSET),
                GROUPS_STORE_PORT: str(env.store_port + PG_STORE_OFFSET),
                ACTIVE_WORLD_SIZE: str(env.nnodes * nproc),
            }
        )
    return out


def _groups_store(store_address: str, port: int, timeout: float) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(  # type: ignore[attr-defined]
        host_name=store_address,
        port=port + PG_STORE_OFFSET,
        is_master=False,
        wait_for_workers=False,
        timeout=dt.timedelta(seconds=timeout),
    )


def world_formed(store_address: str, port: int, timeout: float = 600.0) -> bool:
    """Whether the world already formed (this pod replaces one it lost): asked of the store pod's
    process-group store, where rank 0 sets the key when the first iteration starts. Retried while
    the store pod is not serving yet (it may start after this pod), up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return bool(_groups_store(store_address, port, 10.0).check([WORLD_FORMED_KEY]))
        except Exception as err:  # torch raises DistNetworkError/RuntimeError while it cannot connect
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the store pod at {store_address}:{port + PG_STORE_OFFSET} did not answer"
                ) from err
            log.info("waiting for the store pod at %s (%s)", store_address, type(err).__name__)
            time.sleep(1.0)


def record_release_signals() -> list[int]:
    """SIGTERM and SIGINT handlers that only record the signal in the list returned, for a main
    thread that polls it in short sleeps: a blocked-signal wait covers one thread only (a signal
    delivered to another would kill the process), and a handler that raised could fire inside
    logging, which swallows exceptions."""
    released: list[int] = []

    def release(signum: int, _frame: object) -> None:
        released.append(signum)

    signal.signal(signal.SIGTERM, release)
    signal.signal(signal.SIGINT, release)
    return released


def stand_by(store_address: str, port: int, *, poll_seconds: float = 1.0) -> int:
    """Hold the node until the world finishes (exit 0: this slot's part of the job is done, as its
    replacement ranks finished it) or SIGTERM (the operator deletes the pod)."""
    released = record_release_signals()
    log.info("standing by until the world finishes or SIGTERM")
    store = None
    while not released:
        try:
            store = store or _groups_store(store_address, port, timeout=poll_seconds * 5)
            if store.check([WORLD_FINISHED_KEY]):
                log.info("the world finished its training: this pod's part is done")
                return 0
        except Exception as err:
            log.debug("store not answering: %s", err)
            store = None
        time.sleep(poll_seconds)
    log.info("%s received while standing by", signal.Signals(released[0]).name)
    return 0


def pod_status(codes: Sequence[int]) -> int:
    """The container's exit status from its ranks' (pure): success when one finished the training
    and no rank broke the world; else the first failure."""
    if WORLD_BROKEN_EXIT_CODE in codes:
        return WORLD_BROKEN_EXIT_CODE
    if any(code == 0 for code in codes):
        return 0
    return next((code for code in codes if code != 0), 1)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def record_signals() -> list[int]:
    """SIGTERM and SIGINT from now on recorded in the list returned, for :func:`run_forwarding_drain` to
    act on: a pod may be deleted while rtj-launch still starts its endpoint, before its children."""
    received: list[int] = []

    def record(signum: int, _frame: object) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, record)
    signal.signal(signal.SIGINT, record)
    return received


def run_forwarding_drain(
    command: Sequence[str],
    envs: Sequence[dict[str, str]],
    marker: Path,
    *,
    preexec: Callable[[], None] | None = None,
    started: Callable[[Sequence[Child]], None] | None = None,
    received: list[int] | None = None,
    spawn: Callable[[dict[str, str]], Child] | None = None,
) -> int:
    """Run one process per environment, each in its own session; forward SIGTERM (after marking
    the drain) to all of them, also one that came before they existed (`received`: from
    :func:`record_signals`); wait for all; return the pod's status (``pod_status``), or the drain's
    when a SIGTERM ended a failing run. `started` is told the processes once they run (rtj-launch
    stops ft_launcher on a start-up failure, and serves its endpoint only once no more forks come).
    `spawn` starts one from its environment (default: `command` as a new process; Supervisor's
    ranks are forked after the imports: ``rtj_trainer.runtime.forked``)."""
    received = received if received is not None else []
    children: list[Child] = []

    def new_process(env: dict[str, str]) -> Child:
        return subprocess.Popen(list(command), env=env, start_new_session=True, preexec_fn=preexec)  # noqa: PLW1509 - no threads yet

    start = spawn or new_process

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM:
            marker.touch()
        received.append(signum)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    with contextlib.suppress(FileNotFoundError):
        drain.step_file(marker).unlink()
    if signal.SIGTERM in received:  # a drain that came before the children: they start drained
        marker.touch()
    for rank_env in envs:
        children.append(start({**rank_env, drain.DRAIN_FILE_ENV: str(marker)}))
    if started is not None:
        started(children)
    if received:  # a signal that came before the children existed
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, received[0])
    codes: dict[int, int] = {}
    while len(codes) < len(children):
        for index, child in enumerate(children):
            returncode = None if index in codes else child.poll()
            if returncode is None:
                continue
            codes[index] = _exit_status(returncode)
            if codes[index] != 0 and len(codes) < len(children):
                log.warning(
                    "local rank %d ended with status %d; its siblings go on (the world replaces it)",
                    index,
                    codes[index],
                )
        time.sleep(POLL_SECONDS)
    status = pod_status([codes[i] for i in range(len(children))])
    if signal.SIGTERM in received and status != 0:
        message = drain.termination_message(marker)
        log.info("%s", message)
        drain.write_termination_message(message)
        if drain.step_file(marker).exists():
            return drain.DRAINED_EXIT_CODE
    return status
