"""``rtj-train``'s report for its node: progress carried on across processes, recoveries, node faults.

The trainer (``train``) keeps one ``NodeReport`` per process. It continues the report a previous
process of this node left (``rtj_trainer.load_node_state``: its recovery events and restart counts),
tells which fault this process or in-process iteration recovers from (an injected one, timed by
``rtj_trainer.rehearsal.fault_injection``, else the moment it was noticed) and records the recovery
event at the first step after it, counts the faults blamed on the node (``rtj_trainer.NodeFaults``),
and reports through ``rtj_trainer.Reporter.for_pod``: from one rank per pod.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from rtj_contract.times import epoch_seconds

import rtj_trainer
from rtj_trainer.rehearsal import fault_injection

log = logging.getLogger("rtj_trainer")


@dataclasses.dataclass
class PendingRecovery:
    kind: str
    fault_time: float
    fault_step: int


class NodeReport:
    """This node's progress report as this process keeps it, and the recovery it has yet to record."""

    def __init__(
        self,
        env: rtj_trainer.JobSettings,
        checkpoint_dir: str,
        local_rank: int,
        faults: fault_injection.FaultInjector,
    ) -> None:
        self.env = env
        self.checkpoint_dir = checkpoint_dir
        self.in_job_restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.in_process_base = 0  # the in-process restarts of the node's previous processes
        self.pending: PendingRecovery | None = None
        self.progress = self._resume_node_progress(time.time(), faults)
        self.node_faults = rtj_trainer.NodeFaults(checkpoint_dir, env.node_name)
        # One rank per pod reports: local rank 0, or in supervisor mode whichever active rank of
        # the pod holds the reporting lock (it passes on when its holder dies).
        self.reporter = rtj_trainer.Reporter.for_pod(env, checkpoint_dir, local_rank=local_rank)

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

    def note_node_fault(self, error: BaseException | None, rank: int) -> None:
        """Count `error` as a fault of this node if it blames the node (rtj_trainer.NodeFaults)."""
        reason = self.node_faults.note(error)
        if reason is not None:
            log.warning("rank %d: fault attributed to node %s: %s", rank, self.node_faults.node, reason)

    def check_gpus(self, local_rank: int) -> None:
        """A GPU health check before training; a failure is a fault of the node and ends the process
        (ft_launcher restarts it, and the operator moves the worker once the count passes its
        threshold)."""
        wanted = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.env.nproc_per_node)))
        problem = self.node_faults.check_gpus(local_rank, wanted=wanted)
        if problem is None:
            return
        self.report(force=True)
        raise RuntimeError(problem)

    def count_in_process_restarts(self, iteration: int) -> None:
        """In-process iteration ``iteration`` trains: the node's count goes on from earlier processes'."""
        self.progress.restarts_in_process = self.in_process_base + iteration

    def in_process_fault(
        self, previous_start: float, interrupted_time: float, step: int, faults: fault_injection.FaultInjector
    ) -> None:
        """The fault that ended the iteration that started at ``previous_start``, to recover from: the
        newest one fired since it started (an injected one, on any rank), else the moment this rank
        was interrupted, at ``step``."""
        now = time.time()
        fired = [f.time for f in faults.fired_since(previous_start) if f.time <= now]
        interrupted = interrupted_time if interrupted_time > previous_start else now
        self.pending = PendingRecovery("InProcessRestart", max(fired) if fired else interrupted, step)

    def record_recovery(self, resumed_step: int, source: str) -> bool:
        """The first step after a fault ends the recovery: one event, to be reported at once."""
        if self.pending is None:
            return False
        pending, self.pending = self.pending, None
        event = rtj_trainer.RecoveryEvent.ended_now(
            pending.kind,
            fault_time=pending.fault_time,
            fault_step=pending.fault_step,
            resumed_step=resumed_step,
            resumed_from=source,
        )
        self.progress.add_event(event)
        if self.reports:
            print(event.log_line(), flush=True)
        return True

    def update(
        self, step: int, step_seconds: float, blocking: float, loss: float, useful_seconds: float
    ) -> None:
        """``step`` is done, taking ``step_seconds`` and a save that held training up ``blocking``."""
        p = self.progress
        p.step = step
        p.step_time_seconds = step_seconds
        if blocking > 0:
            p.checkpoint_blocking_seconds = blocking
        p.useful_step_seconds = useful_seconds
        p.loss = loss

    def note_committed(self, checkpoints: rtj_trainer.CheckpointManager) -> None:
        """The newest commit ``checkpoints`` knows of, unless the report has a newer one."""
        p = self.progress
        last = checkpoints.last_committed
        if last is not None and (p.last_checkpoint_step is None or last.step >= p.last_checkpoint_step):
            p.last_checkpoint_step, p.last_checkpoint_time = last.step, last.time

    def _resume_node_progress(
        self, now: float, faults: fault_injection.FaultInjector
    ) -> rtj_trainer.Progress:
        """This node's report, carried on from the one a previous process left (its recovery events,
        its restart counts), and the in-job fault this process recovers from (``self.pending``)."""
        prior = rtj_trainer.load_node_state(self.checkpoint_dir, self.env.node_rank)
        events: list[dict[str, Any]] = []
        if prior is not None and not prior.get("finished", False):
            self.in_process_base = int(prior.get("restarts", {}).get("inProcess", 0))
            events = list(prior.get("events", []))
            self.pending = _in_job_fault(prior, events, now, faults)
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


def _in_job_fault(
    prior: dict[str, Any], events: list[dict[str, Any]], now: float, faults: fault_injection.FaultInjector
) -> PendingRecovery:
    """This process replaces one that died: when did that happen and how far had it got?"""
    last_report = epoch_seconds(prior.get("time")) or now
    since = max([float(e.get("recoveredEpoch", 0.0)) for e in events] + [0.0])
    fired = faults.fired_since(since)
    if fired:
        newest = fired[-1]
        return PendingRecovery("InJobRestart", newest.time, newest.step)
    return PendingRecovery("InJobRestart", last_report, int(prior.get("step", 0)))
