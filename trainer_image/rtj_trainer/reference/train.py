"""``rtj-train``: FSDP training that survives faults, the program each ft_launcher worker runs.

One process per rank (ft_launcher sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; without them
it runs as a single rank). The training function runs under NVRx's in-process ``Wrapper``
(``rtj_trainer.reference.restart``): on an exception in any rank, every rank restarts the function in the same
interpreter; the process group (on a fresh store prefix), the FSDP2 model and the optimizer are
rebuilt inside it, and the state comes back from memory when every rank holds the same, intact
step, otherwise from the newest complete checkpoint (``rtj_trainer.CheckpointManager``). A killed or
hung rank is ft_launcher's job: the new processes resume from the checkpoint, and the node's
persisted progress (``rtj_trainer.load_node_state``) tells them which fault they are recovering from.
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
from rtj_contract.times import epoch_seconds

import rtj_trainer
from rtj_trainer.reference import replica
from rtj_trainer.reference.interrupt import MainThreadWaker, WorldBrokenError
from rtj_trainer.reference.model import (
    ModelConfig,
    batch_for_step,
    build_model,
    local_state,
    restore_local_state,
    shard_model,
    transition_table,
)
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


@dataclasses.dataclass
class InMemoryState:
    """The newest state in memory, kept across in-process restarts (references, not copies)."""

    step: int = -1
    tensors: dict[str, torch.Tensor] | None = None
    consistent: bool = False
    rank: int = -1
    world_size: int = -1
    useful_seconds: float = 0.0


@dataclasses.dataclass
class PendingRecovery:
    kind: str
    fault_time: float
    fault_step: int


def _device(local_rank: int) -> tuple[torch.device, str]:
    """This rank's device and the process groups' backend: its GPU and NCCL, else the CPU and gloo."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


class Trainer:
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
        self.cfg = ModelConfig(
            vocab=args.vocab,
            hidden=args.hidden,
            layers=args.layers,
            seq_len=args.seq_len,
            batch=args.batch,
            seed=args.seed,
        )
        self.checkpoint_dir = args.checkpoint_dir or env.checkpoint_dir
        self.interval = args.checkpoint_interval or env.checkpoint_interval_steps
        self.asynchronous = (args.checkpoint_mode or env.checkpoint_mode) == "Async"
        self.heartbeats = rtj_trainer.Heartbeats()
        self.ckpt = self._checkpoint_manager(self.rank)
        self.faults = fault_injection.FaultInjector(
            fault_injection.parse_faults(env.faults), self.checkpoint_dir, self.rank
        )
        self.in_memory = InMemoryState()
        self.tier = replica.MemoryTier(stride=max(env.nproc_per_node, 1))
        self.waker: MainThreadWaker | None = None
        self.current_step = 0
        self.loop_started: float | None = None  # the first step of this process
        self.iteration_started = time.time()
        self.interrupted_time = 0.0
        self.interrupted_by: BaseException | None = None
        self.in_job_restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

        self.progress = self._resume_node_progress(time.time())
        self.node_faults = rtj_trainer.NodeFaults(self.checkpoint_dir, env.node_name)
        # One rank per pod reports: local rank 0, or in supervisor mode whichever active rank of
        # the pod holds the reporting lock (it passes on when its holder dies).
        self.reporter = rtj_trainer.Reporter.for_pod(env, self.checkpoint_dir, local_rank=self.local_rank)
        # Before any use of the GPU: a GPU that is gone or does not answer is the node's fault.
        self.check_gpus()
        self.device, self.backend = _device(self.local_rank)
        self.pg_store = self._groups_store()

    def _resume_node_progress(self, now: float) -> rtj_trainer.Progress:
        """This node's report, carried on from the one a previous process left (its recovery events,
        its restart counts), and the in-job fault this process recovers from (``self.pending``)."""
        prior = rtj_trainer.load_node_state(self.checkpoint_dir, self.env.node_rank)
        self.in_process_base = 0
        events: list[dict[str, Any]] = []
        self.pending: PendingRecovery | None = None
        if prior is not None and not prior.get("finished", False):
            self.in_process_base = int(prior.get("restarts", {}).get("inProcess", 0))
            events = list(prior.get("events", []))
            self.pending = self._in_job_fault(prior, events, now)
            # TORCHELASTIC_RESTART_COUNT is per agent and stays 0 on a node whose workers restarted
            # because another node's failed; the persisted count sees every restart of this node.
            persisted = int(prior.get("restarts", {}).get("inJob", 0)) + 1
            self.in_job_restarts = max(self.in_job_restarts, persisted)
        progress = rtj_trainer.Progress(
            node_rank=self.env.node_rank,
            train_start_time=rtj_trainer.train_start_time(self.checkpoint_dir, now),
        )
        progress.events = events
        progress.restarts_in_job = self.in_job_restarts
        progress.restarts_in_process = self.in_process_base
        return progress

    def _groups_store(self) -> Any:
        """The process groups' store: it lives across in-process iterations (each uses a prefix).
        Rank 0 hosts it, or in supervisor mode the store pod does."""
        timeout = dt.timedelta(seconds=self.env.inprocess_barrier_timeout_seconds)
        if self.env.supervisor_mode:
            return dist.TCPStore(  # type: ignore[attr-defined]
                host_name=self.master_addr,
                port=self.store_ports.groups,
                is_master=False,
                timeout=timeout,
                wait_for_workers=False,
            )
        return dist.TCPStore(  # type: ignore[attr-defined]
            host_name=self.master_addr,
            port=self.store_ports.groups,
            world_size=self.world_size,
            is_master=self.rank == 0,
            timeout=timeout,
            wait_for_workers=True,
            multi_tenant=True,
        )

    def _checkpoint_manager(self, rank: int) -> rtj_trainer.CheckpointManager:
        return rtj_trainer.CheckpointManager(
            self.checkpoint_dir,
            rank=rank,
            world_size=self.world_size,
            asynchronous=self.asynchronous,
            keep=self.env.checkpoint_keep,
            keepalive=self.heartbeats.keepalive,
            # An async save's copy overlaps the next step's compute (wait_staged() before opt.step).
            stage_in_background=True,
        )

    def _take_index(self, rank: int) -> None:
        """A reserve rank activated in place of a lost one: from now on it is rank `rank`."""
        log.warning("reserve rank %d takes the index of lost rank %d", self.rank, rank)
        self.ckpt.close()
        self.rank = rank
        self.ckpt = self._checkpoint_manager(rank)
        self.faults = fault_injection.FaultInjector(self.faults.faults, self.checkpoint_dir, rank)

    def _delivered(self) -> float:
        """The restart reached the main thread: stop poking it; returns the time."""
        if self.waker is not None:
            self.waker.delivered()
        return time.time()

    def _in_process_fault(self, previous_start: float) -> PendingRecovery:
        """The fault that ended the previous iteration: the newest one fired since it started (an
        injected one, on any rank), else the moment this rank was interrupted."""
        now = time.time()
        fired = [f.time for f in self.faults.fired_since(previous_start) if f.time <= now]
        interrupted = self.interrupted_time if self.interrupted_time > previous_start else now
        return PendingRecovery("InProcessRestart", max(fired) if fired else interrupted, self.current_step)

    def _in_job_fault(
        self, prior: dict[str, Any], events: list[dict[str, Any]], now: float
    ) -> PendingRecovery:
        """This process replaces one that died: when did that happen and how far had it got?"""
        last_report = epoch_seconds(prior.get("time")) or now
        since = max([float(e.get("recoveredEpoch", 0.0)) for e in events] + [0.0])
        fired = self.faults.fired_since(since)
        if fired:
            newest = fired[-1]
            return PendingRecovery("InJobRestart", newest.time, newest.step)
        return PendingRecovery("InJobRestart", last_report, int(prior.get("step", 0)))

    # -- the wrapped function ---------------------------------------------------------------------

    def run(self, call_wrapper: Any = None) -> int:
        if self.waker is not None:
            self.waker.delivered()
        iteration = 0 if call_wrapper is None else int(call_wrapper.iteration)
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        if rank != self.rank and world_size == self.world_size and self.env.supervisor_mode:
            self._take_index(rank)
        if world_size != self.world_size or rank != self.rank:
            # Shards are per rank of a fixed world: a shrunk world cannot continue in-process.
            # Exit, so ft_launcher restarts every worker with the full world (or, in supervisor
            # mode, the operator restarts the job).
            log.error(
                "in-process restart reassigned rank %d/%d to %d/%d; the world cannot go on",
                self.rank,
                self.world_size,
                rank,
                world_size,
            )
            os._exit(rtj_trainer.WORLD_BROKEN_EXIT_CODE)
        previous_start, self.iteration_started = self.iteration_started, time.time()
        if iteration > 0:
            self.pending = self._in_process_fault(previous_start)
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
        self.progress.restarts_in_process = self.in_process_base + iteration
        model = shard_model(build_model(self.cfg, self.device), self.device.type)
        opt = torch.optim.Adam(model.parameters(), lr=self.args.lr)
        start, source = self._resume(model, opt)
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
            with call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext():
                self.ckpt.wait_staged()
            # Between here and the end of the step the shards are half-updated: not a state to resume.
            self.in_memory.consistent = False
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.in_memory.tensors = local_state(model, opt)
            self.in_memory.step = step + 1
            self.in_memory.consistent = True
            self._replicate(step + 1)
            if self.args.step_sleep > 0:
                time.sleep(self.args.step_sleep)
            step_seconds = time.perf_counter() - started
            self.in_memory.useful_seconds += step_seconds
            self.heartbeats.beat()
            force = self._maybe_record_recovery(resumed_step, source)
            # The final step needs no drain: its checkpoint is committed on the way out anyway.
            if step + 1 < steps and self.drain.agreed(self.device):
                self._drain(step + 1, loss_value, step_seconds, call_wrapper)
            self.ckpt.start_writer()
            blocking = 0.0
            if (step + 1) % self.interval == 0 and step + 1 < steps:
                # Every rank writes this save point or none does (a writer still busy: the state
                # stays in memory only, the durable checkpoint one write behind).
                write = self.ckpt.ready_to_write_everywhere(self.device)
                # Not interrupted half-way by a restart: the writer's queue and the pending save
                # must stay in step.
                with call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext():
                    blocking = self._save(step + 1, loss_value, write=write)
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

    def _replicate(self, step: int) -> None:
        """The memory tier: every RTJ_MEMORY_INTERVAL_STEPS steps, this rank's state to a peer on
        another node, and that peer's to this rank (supervisor mode: a reserve rank that takes a
        lost rank's index resumes from the copy)."""
        interval = self.env.memory_interval_steps
        tensors = self.in_memory.tensors
        if not self.env.supervisor_mode or interval <= 0 or step % interval != 0 or tensors is None:
            return
        self.tier.replicate(step, tensors)

    def _resume_from_replicas(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer
    ) -> tuple[int, str] | None:
        """Supervisor mode: every index's state from memory, the lost ones' from their replicas."""
        mem = self.in_memory
        live = (
            mem.tensors is not None
            and mem.consistent
            and mem.rank == self.rank
            and mem.world_size == self.world_size
        )
        reports = replica.gather_reports(
            self.tier, mem.step if live else -1, self.rank, self.world_size, self.device
        )
        plan = replica.plan_resume(reports)
        if plan.source != "memory":
            log.info("rank %d: not resuming from memory: %s", self.rank, plan.reason)
            return None
        # Adam's state is created lazily: a fresh optimizer has no layout to check against, and
        # restore_local_state checks every shape.
        received = replica.execute_transfers(plan, self.tier, self.rank)
        if received is not None:
            restore_local_state(model, opt, received)
            mem.step = plan.step
            return plan.step, "memory-replica"
        if self.rank in plan.snapshots:
            # A peer was lost in the middle of an exchange: every rank goes back to the step the
            # replicas hold, this one from the copy of its state it sent.
            restore_local_state(model, opt, replica.own_state(self.tier, plan.step))
            mem.step = plan.step
            return plan.step, "memory"
        assert mem.tensors is not None
        restore_local_state(model, opt, mem.tensors)
        mem.step = plan.step
        return plan.step, "memory"

    def _resume(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[int, str]:
        if self.env.supervisor_mode and self.env.memory_interval_steps > 0:
            resumed = self._resume_from_replicas(model, opt)
            if resumed is not None:
                return resumed
        mem = self.in_memory
        usable = (
            mem.tensors is not None
            and mem.consistent
            and mem.world_size == self.world_size
            and mem.rank in (-1, self.rank)
        )
        mem_step = mem.step if usable else -1
        # Every rank must resume from the same step: memory only if all hold the same intact step.
        agree = torch.tensor([1 if usable else 0, mem_step, -mem_step], dtype=torch.long, device=self.device)
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        if int(agree[0]) == 1 and int(agree[1]) == -int(agree[2]):
            assert mem.tensors is not None
            restore_local_state(model, opt, mem.tensors)
            return mem.step, "memory"
        # A save still in flight from before the fault finishes first: it may complete a checkpoint,
        # and no writer may still be writing into a directory that rank 0 discards below. (Resuming
        # from memory does not wait: the save goes on in the background.)
        self.ckpt.wait(timeout=None)
        step = self._newest_verified_checkpoint()
        if step < 0:
            mem.useful_seconds = 0.0
            mem.step = 0
            return 0, "scratch"
        info, payload = self.ckpt.load(step)
        restore_local_state(model, opt, payload["tensors"])
        mem.useful_seconds = float(payload["extra"].get("usefulStepSeconds", 0.0))
        mem.step = step
        self.progress.last_checkpoint_step = info.step
        self.progress.last_checkpoint_time = info.time
        return step, "checkpoint"

    def _newest_verified_checkpoint(self) -> int:
        """The newest checkpoint every rank's shard of which verifies (-1: none), agreed
        (`CheckpointManager.newest_verified_step`)."""
        return self.ckpt.newest_verified_step(self._agreed_newest_checkpoint, self._on_every_rank)

    def _agreed_newest_checkpoint(self) -> int:
        """Rank 0's newest complete checkpoint, on every rank (-1: none)."""
        dist.barrier()
        newest = torch.tensor(
            [self.ckpt.newest_step() if self.rank == 0 else -1], dtype=torch.long, device=self.device
        )
        dist.all_reduce(newest, op=dist.ReduceOp.MAX)
        step = int(newest[0])
        if self.rank == 0:
            # Partial saves newer than the resume point belong to the failed attempt. Their stale
            # .done files must not let the next save of the same step commit before it is written.
            self.ckpt.discard_partials_after(step)
        return step

    def _on_every_rank(self, true_here: bool) -> bool:
        flag = torch.tensor([1 if true_here else 0], dtype=torch.long, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(int(flag[0]))

    def _maybe_record_recovery(self, resumed_step: int, source: str) -> bool:
        if self.pending is None:
            return False
        pending, self.pending = self.pending, None
        event = rtj_trainer.RecoveryEvent(
            kind=pending.kind,
            step=resumed_step,
            fault_time=pending.fault_time,
            recovered_time=time.time(),
            steps_lost=max(0, pending.fault_step - resumed_step),
            resumed_from=source,
        )
        self.progress.add_event(event)
        if self.reports:
            print(event.log_line(), flush=True)
        return True

    def _save(self, step: int, loss_value: float, *, write: bool = True) -> float:
        extra = {"usefulStepSeconds": self.in_memory.useful_seconds, "loss": loss_value}
        self.ckpt.save(step, self.in_memory.tensors or {}, extra, write=write)
        return self.ckpt.stats.last_blocking_seconds

    def _update_progress(self, step: int, step_seconds: float, blocking: float, loss_value: float) -> None:
        p = self.progress
        p.step = step
        p.step_time_seconds = step_seconds
        if blocking > 0:
            p.checkpoint_blocking_seconds = blocking
        p.useful_step_seconds = self.in_memory.useful_seconds
        p.loss = loss_value
        last = self.ckpt.last_committed
        if last is not None and (p.last_checkpoint_step is None or last.step >= p.last_checkpoint_step):
            p.last_checkpoint_step, p.last_checkpoint_time = last.step, last.time

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
        with call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext():
            blocking = 0.0
            last = self.ckpt.last_committed
            if last is None or last.step != step:
                blocking = self._save(step, loss_value)
            committed = self.ckpt.wait_committed(step, timeout=self.args.commit_timeout)
            self.ckpt.poll()
            self._update_progress(step, step_seconds, blocking, loss_value)
            if committed:
                self.drain.record_committed_step(step)
            self.reporter.report(self.progress, force=True)
            if self.local_rank == 0:
                print(f"rtj-drain: rank={self.rank} step={step} committed={committed}", flush=True)
            self.close()
            sys.stdout.flush()
            sys.stderr.flush()
            # Past the wrapper on purpose: an exception would be an in-process restart, not an exit.
            os._exit(self.drain.exit_code)

    def _finish(self, steps: int) -> None:
        """Commit the final checkpoint, then report the run finished."""
        final = self.ckpt.last_committed
        if final is None or final.step != steps:
            self._save(steps, self.progress.loss or 0.0)
        # Waits poll (with heartbeats) rather than sit in a collective: a rank whose shard is written
        # first would otherwise fall silent for as long as the slowest rank's write takes.
        self.ckpt.wait(timeout=None)
        if not self.ckpt.wait_committed(steps, timeout=self.args.commit_timeout):
            raise RuntimeError(f"final checkpoint of step {steps} did not commit")
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
            stats = self.ckpt.stats
            # One line for scripts (bench/trainer_bench.py): this process's loop, final commit included.
            print(
                f"rtj-train: finished steps={steps} loop_seconds={loop:.3f} "
                f"useful_step_seconds={self.in_memory.useful_seconds:.3f} "
                f"checkpoint_blocking_seconds={stats.total_blocking_seconds:.3f} saves={stats.saves} "
                f"mode={'Async' if self.ckpt.asynchronous else 'Sync'}",
                flush=True,
            )

    @property
    def reports(self) -> bool:
        """Whether this rank reports for its pod: local rank 0, or in supervisor mode the active
        rank holding the pod's reporting lock."""
        return self.reporter.reports

    def report(self, *, force: bool = False) -> None:
        """Report progress (one rank per pod), with the faults this node's ranks blamed on it."""
        if self.reports:
            self.progress.node_faults = self.node_faults.summary()
            self.reporter.report(self.progress, force=force)

    def note_node_fault(self, error: BaseException | None) -> None:
        """Count `error` as a fault of this node if it blames the node (rtj_trainer.NodeFaults)."""
        reason = self.node_faults.note(error)
        if reason is not None:
            log.warning("rank %d: fault attributed to node %s: %s", self.rank, self.node_faults.node, reason)

    def check_gpus(self) -> None:
        """A GPU health check before training; a failure is a fault of the node and ends the process
        (ft_launcher restarts it, and the operator moves the worker once the count passes its
        threshold)."""
        wanted = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.env.nproc_per_node)))
        problem = self.node_faults.check_gpus(self.local_rank, wanted=wanted)
        if problem is None:
            return
        self.report(force=True)
        raise RuntimeError(problem)

    def close(self) -> None:
        self.ckpt.close()
        self.heartbeats.close()


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
