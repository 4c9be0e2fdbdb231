"""``rtj-train``: FSDP training that survives faults, the program each ft_launcher worker runs.

One process per rank (ft_launcher sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; without them
it runs as a single rank). The training function runs under NVRx's in-process ``Wrapper``
(``rtj_trainer.reference.restart``): on an exception in any rank, every rank restarts the function in the same
interpreter; the process group (on a fresh store prefix), the FSDP2 model and the optimizer are
rebuilt inside it, and the state comes back from memory when every rank holds the same, intact
step, otherwise from the newest complete checkpoint (``rtj_trainer.CheckpointManager``; the choice
is ``resume``'s, the saves and commits ``checkpoints``'). A killed or hung rank is ft_launcher's
job: the new processes resume from the checkpoint, and the node's persisted progress
(``rtj_trainer.load_node_state``, carried on by ``node_report``) tells them which fault they are
recovering from.
A drain (the pod's SIGTERM, ``rtj_trainer.install_drain_handler``) ends the step in progress, commits
a checkpoint of it on every rank and exits. Everything resilient goes through the library's public
API (``rtj_trainer.__all__``, docs/library.md), as a user's script does.

Ports (``StorePorts``): rank 0 hosts the wrapper's store on MASTER_PORT+1 and the process groups'
store on MASTER_PORT+2, unless RTJ_WRAPPER_STORE_PORT and RTJ_GROUPS_STORE_PORT say where they are
(in supervisor mode rtj-launch sets them to the store pod's).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch
import torch.distributed as dist

import rtj_trainer
from rtj_trainer.reference import replica
from rtj_trainer.reference.checkpoints import TrainerCheckpoints
from rtj_trainer.reference.interrupt import MainThreadWaker, WorldBrokenError
from rtj_trainer.reference.model import (
    ModelConfig,
    batch_for_step,
    build_model,
    local_state,
    shard_model,
    transition_table,
)
from rtj_trainer.reference.node_report import NodeReport
from rtj_trainer.reference.resume import InMemoryState, Place, StateRestore, replicate_when_due
from rtj_trainer.rehearsal import fault_injection

log = logging.getLogger("rtj_trainer")


@dataclasses.dataclass(frozen=True)
class StorePorts:
    """Where in-process restart's store and the process groups' store (it outlives the in-process
    iterations) listen: where the job's settings say (the store pod's, in supervisor mode), else on
    rank 0, on the two ports after MASTER_PORT (a port ft_launcher found free; nothing checked the
    two after it, which matters only where the ranks share a host's ports with other programs)."""

    wrapper: int
    groups: int

    @classmethod
    def of(cls, master_port: int, env: rtj_trainer.JobSettings) -> StorePorts:
        return cls(
            wrapper=env.wrapper_store_port or master_port + 1,
            groups=env.groups_store_port or master_port + 2,
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rtj-train", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="total training steps")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--step-sleep", type=float, default=0.0, help="extra seconds per step (emulates heavier steps)"
    )
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--checkpoint-dir", default=None, help="default: $RTJ_CHECKPOINT_DIR")
    p.add_argument(
        "--checkpoint-interval", type=int, default=None, help="default: $RTJ_CHECKPOINT_INTERVAL_STEPS"
    )
    p.add_argument(
        "--checkpoint-mode", choices=("Async", "Sync"), default=None, help="default: $RTJ_CHECKPOINT_MODE"
    )
    p.add_argument("--pg-timeout", type=float, default=120.0, help="process-group timeout, seconds")
    p.add_argument(
        "--commit-timeout", type=float, default=600.0, help="wait for the final checkpoint, seconds"
    )
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_before_two_free() -> int:
    """A free port whose next two are free as well: a single rank's MASTER_PORT (StorePorts)."""
    port = _free_port()
    for _ in range(100):
        if port + 2 <= 65535 and _bindable(port + 1) and _bindable(port + 2):
            return port
        port = _free_port()
    return port


def ensure_rank_env() -> None:
    """Outside a launcher, run as a single rank."""
    if "RANK" in os.environ:
        return
    os.environ.update(
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        | ({} if "MASTER_PORT" in os.environ else {"MASTER_PORT": str(_port_before_two_free())})
    )


def _device(local_rank: int) -> tuple[torch.device, str]:
    """This rank's device and the process groups' backend: its GPU and NCCL, else the CPU and gloo."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


class Trainer:
    """One rank of ``rtj-train``: its setup, the training function the in-process wrapper runs, and
    its end (the final checkpoint, or a drain's). Where an iteration resumes is ``resume``'s, the
    saves and commits ``checkpoints``', the node's report ``node_report``'s."""

    def __init__(
        self,
        args: argparse.Namespace,
        env: rtj_trainer.JobSettings,
        drain: rtj_trainer.DrainRequest | None = None,
    ) -> None:
        self.args = args
        self.env = env
        self.drain = drain if drain is not None else rtj_trainer.DrainRequest(None)
        # In supervisor mode WORLD_SIZE counts the reserve ranks too; the training world is the
        # active part, and a reserve rank learns its index when it is activated (run()).
        self.rank = int(os.environ["RANK"])
        self.world_size = env.active_world_size or int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.master_addr = os.environ["MASTER_ADDR"]
        self.master_port = int(os.environ["MASTER_PORT"])
        self.store_ports = StorePorts.of(self.master_port, env)
        self.cfg = model_config(args)
        self.checkpoint_dir = args.checkpoint_dir or env.checkpoint_dir
        self.interval = args.checkpoint_interval or env.checkpoint_interval_steps
        self.heartbeats = rtj_trainer.Heartbeats()
        self.in_memory = InMemoryState()
        self.checkpoints = TrainerCheckpoints(
            self.checkpoint_dir,
            rank=self.rank,
            world_size=self.world_size,
            asynchronous=(args.checkpoint_mode or env.checkpoint_mode) == "Async",
            keep=env.checkpoint_keep,
            keepalive=self.heartbeats.keepalive,
            in_memory=self.in_memory,
        )
        self.faults = fault_injection.FaultInjector(
            fault_injection.parse_faults(env.faults), self.checkpoint_dir, self.rank
        )
        self.tier = replica.MemoryTier(stride=max(env.nproc_per_node, 1))
        self.waker: MainThreadWaker | None = None
        self.current_step = 0
        self.loop_started: float | None = None  # the first step of this process
        self.iteration_started = time.time()
        self.interrupted_time = 0.0
        self.interrupted_by: BaseException | None = None
        self.node = NodeReport(env, self.checkpoint_dir, self.local_rank, self.faults)
        # Before any use of the GPU: a GPU that is gone or does not answer is the node's fault.
        self.node.check_gpus(self.local_rank)
        self.device, self.backend = _device(self.local_rank)
        self.pg_store = groups_store(env, self.master_addr, self.store_ports, self.world_size, self.rank)

    @property
    def progress(self) -> rtj_trainer.Progress:
        """This node's report as this process keeps it."""
        return self.node.progress

    @property
    def ckpt(self) -> rtj_trainer.CheckpointManager:
        """The checkpoint manager of this rank's index."""
        return self.checkpoints.manager

    def _take_index(self, rank: int) -> None:
        """A reserve rank activated in place of a lost one: from now on it is rank `rank`."""
        log.warning("reserve rank %d takes the index of lost rank %d", self.rank, rank)
        self.checkpoints.take_index(rank)
        self.rank = rank
        self.faults = fault_injection.FaultInjector(self.faults.faults, self.checkpoint_dir, rank)

    def _delivered(self) -> float:
        """The restart reached the main thread: stop poking it; returns the time."""
        if self.waker is not None:
            self.waker.delivered()
        return time.time()

    # -- the wrapped function ---------------------------------------------------------------------

    def run(self, call_wrapper: Any = None) -> int:
        if self.waker is not None:
            self.waker.delivered()
        iteration = 0 if call_wrapper is None else int(call_wrapper.iteration)
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        if rank != self.rank and world_size == self.world_size and self.env.supervisor_mode:
            self._take_index(rank)
        _exit_if_reassigned((self.rank, self.world_size), (rank, world_size))
        previous_start, self.iteration_started = self.iteration_started, time.time()
        if iteration > 0:
            self.node.in_process_fault(previous_start, self.interrupted_time, self.current_step, self.faults)
            self.note_node_fault(self.interrupted_by)
        store = dist.PrefixStore(f"rtj-pg-{iteration}", self.pg_store)  # type: ignore[attr-defined]
        dist.init_process_group(
            self.backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=dt.timedelta(seconds=self.args.pg_timeout),
            device_id=self.device if self.backend == "nccl" else None,
        )
        if self.env.supervisor_mode and self.rank == 0 and iteration == 0:
            self.pg_store.set(rtj_trainer.WORLD_FORMED_KEY, str(time.time()))
        if self.env.supervisor_mode:
            # Every iteration: a reserve rank that took a lost index brings its own node's zone.
            self.tier.domains = replica.world_domains()
        try:
            result = self._train(iteration, call_wrapper)
        except BaseException:
            # One statement only: the wrapper's RankShouldRestart arrives asynchronously and may
            # land again in this handler; the next iteration builds the recovery record.
            self.interrupted_time, self.interrupted_by = self._delivered(), sys.exc_info()[1]
            raise
        dist.destroy_process_group()
        return result

    def _train(self, iteration: int, call_wrapper: Any) -> int:
        self.heartbeats.connect()
        self.node.count_in_process_restarts(iteration)
        model = shard_model(build_model(self.cfg, self.device), self.device.type)
        opt = torch.optim.Adam(model.parameters(), lr=self.args.lr)
        start, source = self._restore().resume(model, opt, self.progress)
        self.in_memory.rank, self.in_memory.world_size = self.rank, self.world_size
        perm = transition_table(self.cfg)
        steps = self.args.steps
        log.info(
            "rank %d: iteration %d resumes at step %d from %s (pid %d)",
            self.rank,
            iteration,
            start,
            source,
            os.getpid(),
        )
        resumed_step = start
        for step in range(start, steps):
            self.current_step = step
            self.faults.maybe_fire(step)
            started = time.perf_counter()
            if self.loop_started is None:
                self.loop_started = started
            inputs, targets = batch_for_step(self.cfg, step, self.rank, perm)
            logits = model(inputs.to(self.device))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, self.cfg.vocab), targets.to(self.device).reshape(-1)
            )
            loss.backward()  # type: ignore[no-untyped-call]
            loss_value = float(loss.item())
            # Before the optimizer and the memory tier see the step: a NaN is never trained on or copied.
            rtj_trainer.NonFiniteLossError.check(step + 1, loss_value)
            # The previous save's copy of the state must be complete before the state changes; it may
            # hand the copy to the writer's queue, so not half-way interrupted by a restart.
            with _atomic(call_wrapper):
                self.ckpt.wait_staged()
            # Between here and the end of the step the shards are half-updated: not a state to resume.
            self.in_memory.consistent = False
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.in_memory.tensors = local_state(model, opt)
            self.in_memory.step = step + 1
            self.in_memory.consistent = True
            replicate_when_due(self.env, self.tier, self.in_memory, step + 1)
            if self.args.step_sleep > 0:
                time.sleep(self.args.step_sleep)
            step_seconds = time.perf_counter() - started
            self.in_memory.useful_seconds += step_seconds
            self.heartbeats.beat()
            force = self.node.record_recovery(resumed_step, source)
            # The final step needs no drain: its checkpoint is committed on the way out anyway.
            if step + 1 < steps and self.drain.agreed(self.device):
                self._drain(step + 1, loss_value, step_seconds, call_wrapper)
            self.ckpt.start_writer()
            blocking = 0.0
            if (step + 1) % self.interval == 0 and step + 1 < steps:
                blocking = self.checkpoints.save_point(
                    step + 1, loss_value, self.device, _atomic(call_wrapper)
                )
            if self.ckpt.poll():
                force = True
            self._update_progress(step + 1, step_seconds, blocking, loss_value)
            if self.rank == 0 and (step + 1) % self.args.log_interval == 0:
                log.info(
                    "step=%d loss=%.4f step_time=%.4f ckpt_blocking=%.4f",
                    step + 1,
                    loss_value,
                    step_seconds,
                    blocking,
                )
            self.report(force=force)
        self._finish(steps)
        return 0

    def _restore(self) -> StateRestore:
        place = Place(self.rank, self.world_size, self.device)
        return StateRestore(place, self.env, self.ckpt, self.in_memory, self.tier)

    def _update_progress(self, step: int, step_seconds: float, blocking: float, loss_value: float) -> None:
        self.node.update(step, step_seconds, blocking, loss_value, self.in_memory.useful_seconds)
        self.node.note_committed(self.ckpt)

    def _drain(self, step: int, loss_value: float, step_seconds: float, call_wrapper: Any) -> NoReturn:
        """Every rank: save ``step``, wait for its commit, report, exit (``rtj_trainer.DrainRequest``)."""
        if self.rank == 0 or self.drain.requested:
            log.warning(
                "rank %d: %s at step %d: saving a checkpoint before exiting",
                self.rank,
                "SIGTERM" if self.drain.requested else "a peer's SIGTERM",
                step,
            )
        # Atomic to the exit: a peer whose drain ended first is a terminated rank to the in-process
        # wrapper, which would interrupt this drain (an in-process restart in the middle of closing,
        # then a process that never exits) if it could.
        with _atomic(call_wrapper):
            committed, blocking = self.checkpoints.commit(step, loss_value, self.args.commit_timeout)
            self._update_progress(step, step_seconds, blocking, loss_value)
            if committed:
                self.drain.record_committed_step(step)
            self.node.reporter.report(self.progress, force=True)
            if self.local_rank == 0:
                print(f"rtj-drain: rank={self.rank} step={step} committed={committed}", flush=True)
            self.close()
            sys.stdout.flush()
            sys.stderr.flush()
            # Past the wrapper on purpose: an exception would be an in-process restart, not an exit.
            os._exit(self.drain.exit_code)

    def _finish(self, steps: int) -> None:
        """Commit the final checkpoint, then report the run finished."""
        self.checkpoints.commit_final(steps, self.progress.loss or 0.0, self.args.commit_timeout)
        dist.barrier()
        if self.env.supervisor_mode and self.rank == 0:
            self.pg_store.set(rtj_trainer.WORLD_FINISHED_KEY, str(steps))
        self.ckpt.poll()
        self.ckpt.refresh()
        self._update_progress(steps, self.progress.step_time_seconds, 0.0, self.progress.loss or 0.0)
        self.progress.step = steps
        self.progress.finished = True
        self.report(force=True)
        if self.rank == 0:
            loop = time.perf_counter() - (self.loop_started or time.perf_counter())
            print(self.checkpoints.finished_line(steps, loop), flush=True)

    def report(self, *, force: bool = False) -> None:
        """Report progress (one rank per pod), with the faults this node's ranks blamed on it."""
        self.node.report(force=force)

    def note_node_fault(self, error: BaseException | None) -> None:
        """Count `error` as a fault of this node if it blames the node (rtj_trainer.NodeFaults)."""
        self.node.note_node_fault(error, self.rank)

    def close(self) -> None:
        self.ckpt.close()
        self.heartbeats.close()


def model_config(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        vocab=args.vocab,
        hidden=args.hidden,
        layers=args.layers,
        seq_len=args.seq_len,
        batch=args.batch,
        seed=args.seed,
    )


def _atomic(call_wrapper: Any) -> contextlib.AbstractContextManager[object]:
    """The in-process wrapper's section that a restart does not interrupt (nothing without one)."""
    return call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext()


def _exit_if_reassigned(was: tuple[int, int], now: tuple[int, int]) -> None:
    """Exit if in-process restart gave this rank another (rank, world size) than it trains as."""
    if now == was:
        return
    # Shards are per rank of a fixed world: a shrunk world cannot continue in-process. Exit, so
    # ft_launcher restarts every worker with the full world (or, in supervisor mode, the operator
    # restarts the job).
    log.error("in-process restart reassigned rank %d/%d to %d/%d; the world cannot go on", *was, *now)
    os._exit(rtj_trainer.WORLD_BROKEN_EXIT_CODE)


def groups_store(
    env: rtj_trainer.JobSettings, master_addr: str, ports: StorePorts, world_size: int, rank: int
) -> Any:
    """The process groups' store: it lives across in-process iterations (each uses a prefix).
    Rank 0 hosts it, or in supervisor mode the store pod does."""
    timeout = dt.timedelta(seconds=env.inprocess_barrier_timeout_seconds)
    if env.supervisor_mode:
        return dist.TCPStore(  # type: ignore[attr-defined]
            host_name=master_addr,
            port=ports.groups,
            is_master=False,
            timeout=timeout,
            wait_for_workers=False,
        )
    return dist.TCPStore(  # type: ignore[attr-defined]
        host_name=master_addr,
        port=ports.groups,
        world_size=world_size,
        is_master=rank == 0,
        timeout=timeout,
        wait_for_workers=True,
        multi_tenant=True,
    )


def warm_up(cfg: ModelConfig, device: torch.device, lr: float) -> None:
    """One step of an unsharded copy of the model, outside the in-process wrapper, before training.

    The first optimizer step imports torch's compiler front end (torch._dynamo, seconds of CPU);
    a reserve rank activated later would pay that inside its first step, past the soft timeout, and
    an interruption in the middle of the import leaves the module half-registered for good
    (measured: "Duplicate dispatch rule" on every later attempt, until the restart budget ran out).
    """
    import torch._dynamo

    model = build_model(cfg, device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    inputs, targets = batch_for_step(cfg, 0, 0, transition_table(cfg))
    logits = model(inputs.to(device))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), targets.to(device).reshape(-1))
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()


def training_entry(trainer: Trainer, env: rtj_trainer.JobSettings) -> Callable[[], int]:
    """``trainer.run`` under in-process restart (``restart.restartable``, disabled there when
    ``RTJ_INPROCESS_ENABLED=false``). With in-process restart off on an NVRx release that no longer
    has it (NVRx deprecated it in 0.6), the function alone: ft_launcher and the operator recover
    every fault (``rtj_trainer.library.nvrx_inprocess``)."""
    if not env.inprocess_enabled and not rtj_trainer.in_process_available():
        log.info("in-process restart is off and NVRx has none: training runs without its wrapper")
        return functools.partial(trainer.run, None)
    from rtj_trainer.reference.restart import restartable

    ports = trainer.store_ports
    return restartable(
        trainer.run,
        env,
        store_host=trainer.master_addr,
        store_port=ports.wrapper,
        keep_ports=(trainer.master_port, ports.groups, ports.wrapper),
        waker=trainer.waker,
        active_world_size=trainer.world_size if env.supervisor_mode else None,
    )


def finished_before_a_peer_left(error: BaseException, finished: bool) -> bool:
    """Whether `error` came after this rank's training had finished (the final checkpoint committed on
    every rank: `Trainer._finish` ends in a barrier), from the store of a rank that had ended: NVRx's
    in-process wrapper closes with a termination barrier on the store rank 0 hosts, and on 0.7.0 rank
    0 can exit first (make test run m12: rank 3 failed there, so its node's launcher waited for a
    restart that never came). The work is done: the rank ends 0, not as a fault."""
    return finished and isinstance(error, dist.DistNetworkError)


def exit_leaving_threads(code: int) -> NoReturn:
    """End the process now, with what it wrote flushed. After an error out of NVRx's in-process
    wrapper its ProgressWatchdog thread, not a daemon, is left running: the interpreter would wait
    for it at exit forever, and with it the node's ft_launcher (seen in `rtj demo --quick --launcher
    FtLauncher`: a rank that had finished kept its pod Running for minutes)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s rank=" + os.environ.get("RANK", "0") + " %(name)s: %(message)s",
        stream=sys.stdout,
    )
    ensure_rank_env()
    env = rtj_trainer.JobSettings.from_environ(os.environ)
    trainer = Trainer(args, env, rtj_trainer.install_drain_handler())
    trainer.waker = MainThreadWaker()
    trainer.waker.install()
    train = training_entry(trainer, env)
    warm_up(trainer.cfg, trainer.device, trainer.args.lr)
    # Everything imported and built so far lives as long as the process: out of the collector's
    # sight, NVRx's full collection between two in-process iterations takes microseconds instead of
    # the ~0.4 s a pass over torch's objects costs (each restart runs it until nothing is freed).
    gc.freeze()
    try:
        rc = train()
    except WorldBrokenError as error:
        log.error("rank %d: %s", trainer.rank, error)
        trainer.report(force=True)
        return rtj_trainer.WORLD_BROKEN_EXIT_CODE
    except BaseException as error:
        if finished_before_a_peer_left(error, trainer.progress.finished):
            log.warning(
                "rank %d: finished; the store's host left before the last barrier: %s", trainer.rank, error
            )
            trainer.close()
            exit_leaving_threads(0)
        # The fault ends this process (in-process restarts off or used up): count it before ft_launcher
        # starts the next one, and tell the operator.
        trainer.note_node_fault(error)
        trainer.report(force=True)
        raise
    finally:
        trainer.close()
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
