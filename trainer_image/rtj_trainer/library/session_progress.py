"""What a session reports: its progress, carried on from the node's previous process, and the faults.

``rtj_trainer.library.session`` drives a ``SessionProgress`` per process: the report (``progress``:
step, loss, useful time, samples and tokens, the checkpoint save cost and the newest commit), the
recovery event of the first step after a restart, the faults blamed on the node (``node_faults``) and
the step a failing block got to (``failed_step``). Local rank 0 reports; on the other ranks, and
outside a pod, the report is kept but never sent. The session's checkpoints
(``session_checkpoints``) hand it what they saved, loaded and committed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rtj_contract import env as env_names
from rtj_contract.times import epoch_seconds

from rtj_trainer.library import env as env_mod
from rtj_trainer.library import failed_step, node_faults
from rtj_trainer.library import progress as progress_mod

if TYPE_CHECKING:
    from rtj_trainer.library.checkpoint_files import CheckpointInfo

# The session's logger, whichever of its modules logs: a script filters on this one name.
log = logging.getLogger("rtj_trainer.session")


@dataclasses.dataclass
class _Pending:
    """The fault this process recovers from (a previous process of this node ended before finishing)."""

    fault_time: float
    fault_step: int


@dataclasses.dataclass
class _Clock:
    """Step timing: the time since the previous step, less what checkpoint saves blocked meanwhile."""

    last: float = 0.0
    blocked: float = 0.0

    def restart(self) -> None:
        self.last, self.blocked = time.monotonic(), 0.0

    def lap(self) -> float:
        now = time.monotonic()
        seconds = max(0.0, now - self.last - self.blocked)
        self.last, self.blocked = now, 0.0
        return seconds


class SessionProgress:
    """This process's report, its reporter (local rank 0 in a pod) and the step clock."""

    def __init__(self) -> None:
        self.progress = progress_mod.Progress(node_rank=0, train_start_time=time.time())
        self.clock = _Clock()
        self.resumed: tuple[int, str] | None = None  # (step, source) of Session.load()
        self._reporter: progress_mod.Reporter | None = None
        self._node_faults: node_faults.NodeFaults | None = None
        self._pending: _Pending | None = None
        self._report_failed = False

    def start(
        self, environ: Mapping[str, str], env: env_mod.TrainerEnv, checkpoint_dir: str | None, local_rank: int
    ) -> list[str]:
        """The reporter (local rank 0 only) and the counters a previous process of this node left;
        returns what is missing for reports."""
        if not environ.get(progress_mod.PROGRESS_FILE_ENV) and "endpoint" in env.progress_sink:
            return [f"progress: {progress_mod.PROGRESS_FILE_ENV} is not set (nothing is reported)"]
        if checkpoint_dir is None:
            return [f"progress: {env_names.CHECKPOINT_DIR} is not set (the report's state lives there)"]
        if local_rank != 0:
            return []
        now = time.time()
        self._reporter = progress_mod.Reporter(
            progress_mod.make_sink(env.progress_sink, environ), checkpoint_dir, env.progress_interval_seconds
        )
        prior = progress_mod.load_node_state(checkpoint_dir, env.node_rank)
        self.progress = _resumed_progress(
            prior,
            env.node_rank,
            progress_mod.train_start_time(checkpoint_dir, now),
            int(environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
        )
        self._pending = _pending_fault(prior, now)
        self._node_faults = node_faults.NodeFaults(checkpoint_dir, env.node_name)
        return []

    def step_done(self, step: int, loss: float | None, *, samples: int | None, tokens: int | None) -> None:
        """``step`` steps are done: the time since the previous one, less the saves', is its compute."""
        compute = self.clock.lap()
        p = self.progress
        p.count_work(compute, samples=samples, tokens=tokens)
        p.step = step
        p.step_time_seconds = compute
        p.useful_step_seconds += compute
        if loss is not None:
            p.loss = loss

    def record_recovery(self, step: int) -> bool:
        """The first step after a restart ends the recovery: one event, reported at once."""
        if self._pending is None:
            return False
        pending, self._pending = self._pending, None
        resumed_step, source = self.resumed or (max(step - 1, 0), "checkpoint" if step > 1 else "scratch")
        event = progress_mod.RecoveryEvent.ended_now(
            "InJobRestart",
            fault_time=pending.fault_time,
            fault_step=pending.fault_step,
            resumed_step=resumed_step,
            resumed_from=source,
        )
        self.progress.add_event(event)
        print(event.log_line(), flush=True)
        return True

    def checkpoint_extra(self) -> dict[str, Any]:
        """What a checkpoint keeps of the report, for a resume to carry on from (:meth:`resumed_from`)."""
        p = self.progress
        return {"usefulStepSeconds": p.useful_step_seconds, "loss": p.loss, **p.work_json()}

    def saved(self, blocking_seconds: float) -> None:
        """A save held training up this long: not compute, and the checkpoint advice's save cost."""
        self.clock.blocked += blocking_seconds
        self.progress.checkpoint_blocking_seconds = blocking_seconds

    def checkpoint_made(self, step: int, blocking_seconds: float | None) -> None:
        """The script made a checkpoint of ``step`` itself (``Session.checkpoint_saved``)."""
        p = self.progress
        p.last_checkpoint_step, p.last_checkpoint_time = step, time.time()
        if blocking_seconds is not None:
            self.saved(blocking_seconds)

    def resumed_from(self, step: int, checkpoint: tuple[CheckpointInfo, Mapping[str, Any]] | None) -> None:
        """Training resumes at ``step``: from a checkpoint (its info and ``extra``), or from scratch
        (None), whose counters then start at zero."""
        p = self.progress
        extra: Mapping[str, Any] = {} if checkpoint is None else checkpoint[1]
        p.useful_step_seconds = float(extra.get("usefulStepSeconds", 0.0))
        p.resume_work(extra)
        if checkpoint is not None:
            p.last_checkpoint_step, p.last_checkpoint_time = checkpoint[0].step, checkpoint[0].time
        self.resumed = (step, "scratch" if checkpoint is None else "checkpoint")
        self.clock.restart()

    def note_committed(self, last: CheckpointInfo | None) -> None:
        p = self.progress
        if last is not None and (p.last_checkpoint_step is None or last.step >= p.last_checkpoint_step):
            p.last_checkpoint_step, p.last_checkpoint_time = last.step, last.time

    def failed(self, error: BaseException) -> None:
        """The block ended with ``error``: count it against the node if it blames the node, note the
        step it failed after (`failed_step`: its launcher compares the tries), report."""
        reason = self._node_faults.note(error) if self._node_faults is not None else None
        if reason is not None and self._node_faults is not None:
            log.warning("fault attributed to node %s: %s", self._node_faults.node, reason)
        if isinstance(error, Exception):  # not an exit, an interrupt or a drain's SystemExit
            failed_step.add_note(error, self._steps_done())
        self.report(force=True)

    def report(self, *, force: bool) -> None:
        if self._reporter is None:
            return
        if self._node_faults is not None:
            self.progress.node_faults = self._node_faults.summary()
        try:
            self._reporter.report(self.progress, force=force)
        except OSError as error:
            # Progress is advisory: a full or vanished volume must not stop training.
            if not self._report_failed:
                log.warning("progress not reported: %s", error)
                self._report_failed = True

    def _steps_done(self) -> int:
        """The newest step this process finished, or resumed at before its first step."""
        resumed = self.resumed[0] if self.resumed is not None else 0
        return max(self.progress.step, resumed)


def _pending_fault(prior: Mapping[str, Any] | None, now: float) -> _Pending | None:
    """A previous process of this node reported and did not finish: this one recovers from its end."""
    if prior is None or prior.get("finished", False):
        return None
    return _Pending(fault_time=epoch_seconds(prior.get("time")) or now, fault_step=int(prior.get("step", 0)))


def _resumed_progress(
    prior: Mapping[str, Any] | None, node_rank: int, train_start: float, restart_count: int
) -> progress_mod.Progress:
    """This process's report, continuing the counters of the node's previous process (as rtj-train
    does): restarts, events, useful step seconds, samples and tokens (``Session.load`` replaces the
    last three with the checkpoint's)."""
    p = progress_mod.Progress(node_rank=node_rank, train_start_time=train_start)
    p.restarts_in_job = restart_count
    if prior is None or prior.get("finished", False):
        return p
    restarts = prior.get("restarts")
    restarts = restarts if isinstance(restarts, Mapping) else {}
    p.restarts_in_process = int(restarts.get("inProcess", 0))
    # TORCHELASTIC_RESTART_COUNT stays 0 on a node whose workers restarted because another node's
    # failed; the persisted count sees every restart of this node.
    p.restarts_in_job = max(restart_count, int(restarts.get("inJob", 0)) + 1)
    p.events = [e for e in prior.get("events", []) if isinstance(e, dict)]
    p.useful_step_seconds = float(prior.get("usefulStepSeconds", 0.0))
    p.resume_work(prior)
    return p
