"""The library's session: what a training script of one's own calls, behind the public facade.

``rtj_trainer.Session`` (re-exported by ``rtj_trainer/__init__.py``; docs/library.md is its
reference) brings a user's FSDP or DDP loop the parts of ``rtj-train`` that the operator reads or
acts on, built from the same modules of ``rtj_trainer.library``: progress reports (``progress``: step,
loss, goodput, the checkpoint save cost behind the checkpoint advice, restarts and recovery events),
the async sharded checkpoints with their atomic commit (``checkpoint``), drains on SIGTERM
(``drain``), faults blamed on the node (``node_faults``) and a named fault reason in the termination
message.

Nothing here imports torch at import time: the session imports it when a checkpoint is saved or
loaded, or when a process group is initialized for a collective. Outside a pod (no ``rtj-launch``
environment) the session reports nothing and, without a checkpoint directory, saves nothing, and it
says so once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, SupportsFloat

from rtj_contract import env as env_names
from rtj_contract import termination
from rtj_contract.times import epoch_seconds

from rtj_trainer.library import drain as drain_mod
from rtj_trainer.library import env as env_mod
from rtj_trainer.library import failed_step, finite_loss, node_faults
from rtj_trainer.library import progress as progress_mod

if TYPE_CHECKING:
    import torch

    from rtj_trainer.library.checkpoint import CheckpointManager

log = logging.getLogger("rtj_trainer.session")

# Kubernetes keeps at most 4096 bytes of a termination message.
MAX_FAULT_MESSAGE_CHARS: Final = 1024
# The key that marks a tensor leaf in the saved state's skeleton (the non-tensor part of a state dict).
_TENSOR_KEY: Final = "__rtj_tensor__"
# What a state dict may hold besides tensors, dicts, lists and tuples: what torch.load(weights_only) reads.
_PLAIN_LEAVES: Final = (bool, int, float, str, type(None))


class _Phase:
    NEW: Final = "new"
    STARTED: Final = "started"
    CLOSED: Final = "closed"


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


class Session:
    """A training process's link to the operator: progress, checkpoints, drains and fault reasons.

    Create it once per process and run the training loop inside ``with session:``; every rank
    does the same. Nothing is read from the environment before the block starts. See
    docs/library.md for the whole contract; each method's docstring says what it does.
    """

    def __init__(
        self,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        keepalive: Callable[[], None] | None = None,
        commit_timeout_seconds: float = 600.0,
        allow_non_finite_loss: bool = False,
    ) -> None:
        """``checkpoint_dir``: where :meth:`save` and :meth:`load` keep checkpoints (default: the
        job's, ``RTJ_CHECKPOINT_DIR``; neither: no checkpoints). ``keepalive``: called while the
        session waits for a checkpoint write or commit (e.g. ``rtj_trainer.Heartbeats``'s ``keepalive``,
        so ft_launcher does not take a rank waiting on a slow volume for a hung one).
        ``commit_timeout_seconds``: how long a drain or the end of the block waits for the last
        checkpoint's commit. ``allow_non_finite_loss``: report a NaN or infinite loss instead of
        raising (a script that skips such steps itself, as a mixed-precision loss scaler does)."""
        self._allow_non_finite_loss = allow_non_finite_loss
        self._checkpoint_dir_arg = None if checkpoint_dir is None else str(checkpoint_dir)
        self._keepalive = keepalive
        self._commit_timeout = commit_timeout_seconds
        self._phase = _Phase.NEW
        self._env = env_mod.TrainerEnv()
        self._checkpoint_dir: str | None = None
        self._local_rank = 0
        self._reporter: progress_mod.Reporter | None = None
        self._progress = progress_mod.Progress(node_rank=0, train_start_time=time.time())
        self._node_faults: node_faults.NodeFaults | None = None
        self._pending: _Pending | None = None
        self._drain: drain_mod.DrainRequest | None = None
        self._previous_sigterm: Any = None
        self._draining = False
        self._ckpt: CheckpointManager | None = None
        self._last_saved: int | None = None
        self._own_checkpoint: int | None = None
        self._resumed: tuple[int, str] | None = None  # (step, source) of load()
        self._clock = _Clock()
        self._report_failed = False

    # -- the loop -------------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self._phase != _Phase.NEW:
            raise RuntimeError("a Session runs one block: create a new one")
        self._start(os.environ)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self._finish()
            else:
                self._failed(exc)
        finally:
            self._close()

    def step(
        self,
        step: int,
        *,
        loss: SupportsFloat | None = None,
        samples: int | None = None,
        tokens: int | None = None,
    ) -> None:
        """Record that ``step`` steps are done (the step just finished, counting from 1).

        Every rank calls it once per step, at the same point: in a pod it carries one small
        all-reduce (whether any rank was asked to drain, then :attr:`draining`). It finalizes and
        commits checkpoint writes that finished, and local rank 0 reports (at most once a second
        to the pod's endpoint, at once on a commit or a recovery). ``loss``: a number or a
        one-element tensor (a CUDA tensor synchronizes: pass a float you already have when that
        matters). A NaN or infinite ``loss`` raises :class:`rtj_trainer.NonFiniteLossError` before
        the step counts (unless the session allows it), so the block ends and the ranks resume from
        the last checkpoint, which the bad step never reached. ``samples``, ``tokens``: what this
        step trained on across the whole job (the global batch: the same on every rank, as the
        operator shows a node's report as the job's), whole numbers >= 0; the report carries their
        totals and their rate over the recent useful step time, once given (docs/library.md,
        "Samples and tokens").
        """
        self._require_started()
        value = _loss_value(loss)
        if value is not None and not self._allow_non_finite_loss:
            finite_loss.NonFiniteLossError.check(step, value)  # before the step counts: never trained on
        compute = self._clock.lap()
        p = self._progress
        p.count_work(compute, samples=samples, tokens=tokens)
        p.step = step
        p.step_time_seconds = compute
        p.useful_step_seconds += compute
        if value is not None:
            p.loss = value
        force = self._record_recovery(step)
        self._draining = self._agree_on_drain()
        if self._ckpt is not None and self._ckpt.poll():
            force = True
        self._note_committed()
        self._report(force=force)

    @property
    def draining(self) -> bool:
        """Whether the job asked this world to drain (the pod's SIGTERM on any rank, agreed by
        :meth:`step`): then call :meth:`drain` with the step just done."""
        return self._draining

    @property
    def checkpoint_interval_steps(self) -> int:
        """``spec.checkpoint.intervalSteps`` (``RTJ_CHECKPOINT_INTERVAL_STEPS``, default 100): save
        when ``step % session.checkpoint_interval_steps == 0``."""
        self._require_started()
        return self._env.checkpoint_interval_steps

    # -- checkpoints ----------------------------------------------------------------------------

    def save(self, step: int, state_dict: Mapping[str, Any]) -> None:
        """Save this rank's part of the state after ``step`` steps; every rank saves the same steps.

        The project's sharded protocol (docs/trainer.md): each rank writes its own shard (a
        ``DTensor``'s local shard, other tensors whole), a committed checkpoint is one that every
        rank's shard reached, and :meth:`load` never reads another. With ``spec.checkpoint.mode``
        ``Async`` (the default) it returns once the state is copied to host memory, and a writer
        process writes it while training goes on; ``Sync`` writes it before it returns. The state
        may hold tensors, numbers, strings, None, and dicts, lists and tuples of them. Without a
        checkpoint directory it does nothing.
        """
        self._require_started()
        manager = self._manager()
        if manager is None:
            return
        tensors: dict[str, torch.Tensor] = {}
        skeleton = _split_state(state_dict, (), tensors)
        extra = {
            "usefulStepSeconds": self._progress.useful_step_seconds,
            "loss": self._progress.loss,
            "state": skeleton,
            **self._progress.work_json(),
        }
        manager.save(step, tensors, extra)
        blocking = manager.stats.last_blocking_seconds
        self._clock.blocked += blocking
        self._progress.checkpoint_blocking_seconds = blocking
        self._last_saved = step

    def load(self, *, like: Mapping[str, Any] | None = None) -> tuple[int, dict[str, Any] | None]:
        """The newest complete checkpoint: ``(step, state)``, or ``(0, None)`` when there is none.

        Every rank calls it (with a process group of more than one rank, the ranks agree on the
        step). The state has the structure that was saved, with this rank's tensors on the CPU;
        ``like`` (the state dict of the freshly built model and optimizer, same structure) puts
        each tensor where its counterpart is: on its device, and as a ``DTensor`` of the same mesh
        and placements where the counterpart is one (FSDP2).
        """
        self._require_started()
        manager = self._manager()
        if manager is None:
            self._resumed = (0, "scratch")
            return 0, None
        step = manager.newest_verified_step(lambda: self._agreed_newest_step(manager), _on_every_rank)
        if step < 0:
            self._resumed = (0, "scratch")
            self._progress.useful_step_seconds = 0.0
            self._progress.resume_work({})
            self._clock.restart()
            return 0, None
        info, payload = manager.load(step)
        extra = payload["extra"]
        if "state" not in extra:
            raise RuntimeError(
                f"the checkpoint of step {step} in {manager.root} was not saved by Session.save"
            )
        state = _join_state(extra["state"], payload["tensors"], like, ())
        self._progress.useful_step_seconds = float(extra.get("usefulStepSeconds", 0.0))
        self._progress.resume_work(extra)
        self._progress.last_checkpoint_step, self._progress.last_checkpoint_time = info.step, info.time
        self._resumed = (step, "checkpoint")
        self._clock.restart()
        return step, state

    def checkpoint_saved(self, step: int, *, blocking_seconds: float | None = None) -> None:
        """Tell the operator about a checkpoint the script made itself, complete at ``step``.

        ``blocking_seconds``: how long the save held up training (the checkpoint advice's save
        cost). Call it on every rank (local rank 0 of each pod reports it; :meth:`drain` without a
        state counts it on each rank).
        """
        self._require_started()
        p = self._progress
        p.last_checkpoint_step, p.last_checkpoint_time = step, time.time()
        if blocking_seconds is not None:
            p.checkpoint_blocking_seconds = blocking_seconds
            self._clock.blocked += blocking_seconds
        self._own_checkpoint = step
        self._report(force=True)

    # -- drains and faults ----------------------------------------------------------------------

    def drain(self, step: int, state_dict: Mapping[str, Any] | None = None) -> NoReturn:
        """Every rank, once :attr:`draining`: commit a checkpoint of ``step``, report, and exit.

        Saves ``state_dict`` as :meth:`save` does (unless ``step`` is committed already) and waits
        for the commit; without ``state_dict`` the script's own checkpoint of ``step`` counts,
        if :meth:`checkpoint_saved` reported it. The process then exits at once (``os._exit``,
        after flushing stdout and stderr: ``finally`` blocks do not run) with the drain's exit
        code: 143 on the drained pod's ranks, 75 on the others (their launcher restarts them into
        the world that resumes from this checkpoint). Does not return.
        """
        self._require_started()
        request = self._drain
        if request is None or not self._draining:
            raise RuntimeError("drain() is for a drain: call it when session.draining is True")
        manager = self._manager() if state_dict is not None else self._ckpt
        committed = self._own_checkpoint == step
        if manager is not None:
            already = manager.last_committed is not None and manager.last_committed.step == step
            if state_dict is not None and not already:
                self.save(step, state_dict)
            if already or self._last_saved == step:
                committed = manager.wait_committed(step, timeout=self._commit_timeout)
            manager.poll()
            manager.refresh()  # the other ranks see the commit at once, not at their next re-read
        self._progress.step = max(self._progress.step, step)
        self._note_committed()
        if committed:
            request.record_committed_step(step)
        self._report(force=True)
        if self._local_rank == 0:
            rank = os.environ.get("RANK", "0")
            print(f"rtj-drain: rank={rank} step={step} committed={committed}", flush=True)
        self._close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(request.exit_code)

    def fault(self, reason: str, message: str = "") -> None:
        """Name the reason this container is about to fail, for the job's failure policy.

        Writes the termination message ``FaultReason: <reason>`` (a CamelCase word, as
        ``onFaultReasons`` lists them), then ``message`` on the next line. It takes effect when the
        container exits non-zero (raise or exit after it); a later call replaces it. Outside a pod
        (no ``RTJ_TERMINATION_MESSAGE_PATH``) the reason is only logged.
        """
        if not termination.is_fault_reason(reason):
            raise ValueError(
                f"fault reason {reason!r}: one word of letters and digits, starting with a letter, "
                "at most 64 characters (e.g. DataCorruption)"
            )
        detail = " ".join(message.split())[:MAX_FAULT_MESSAGE_CHARS]
        text = termination.fault_message(reason, detail)
        log.error("fault: %s%s", reason, f": {detail}" if detail else "")
        if not drain_mod.write_termination_message(text):
            log.warning(
                "%s is not set (not in a pod): fault reason %s not written",
                env_names.TERMINATION_MESSAGE_PATH,
                reason,
            )

    # -- start and end --------------------------------------------------------------------------

    def _start(self, environ: Mapping[str, str]) -> None:
        self._env = env_mod.TrainerEnv.from_environ(environ)
        self._local_rank = int(environ.get("LOCAL_RANK") or 0)
        self._checkpoint_dir = self._checkpoint_dir_arg or environ.get(env_names.CHECKPOINT_DIR) or None
        missing = self._start_reporting(environ)
        if self._checkpoint_dir is None:
            missing.append(
                f"checkpoints: {env_names.CHECKPOINT_DIR} is not set and no checkpoint_dir was given "
                "(save() does nothing, load() starts from scratch)"
            )
        self._install_drain_handler(environ, missing)
        if missing and self._local_rank == 0:
            log.warning("rtj_trainer: not in an rtj-launch pod: %s", "; ".join(missing))
        self._phase = _Phase.STARTED
        self._clock.restart()

    def _start_reporting(self, environ: Mapping[str, str]) -> list[str]:
        """The reporter (local rank 0 only) and the counters a previous process of this node left;
        returns what is missing for reports."""
        if not environ.get(progress_mod.PROGRESS_FILE_ENV) and "endpoint" in self._env.progress_sink:
            return [f"progress: {progress_mod.PROGRESS_FILE_ENV} is not set (nothing is reported)"]
        if self._checkpoint_dir is None:
            return [f"progress: {env_names.CHECKPOINT_DIR} is not set (the report's state lives there)"]
        if self._local_rank != 0:
            return []
        env, now = self._env, time.time()
        directory = self._checkpoint_dir
        self._reporter = progress_mod.Reporter(
            progress_mod.make_sink(env.progress_sink, environ), directory, env.progress_interval_seconds
        )
        prior = progress_mod.load_node_state(directory, env.node_rank)
        self._progress = _resumed_progress(
            prior,
            env.node_rank,
            progress_mod.train_start_time(directory, now),
            int(environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
        )
        self._pending = _pending_fault(prior, now)
        self._node_faults = node_faults.NodeFaults(directory, env.node_name)
        return []

    def _install_drain_handler(self, environ: Mapping[str, str], missing: list[str]) -> None:
        marker = environ.get(drain_mod.DRAIN_FILE_ENV, "")
        if not marker:
            missing.append(f"drains: {drain_mod.DRAIN_FILE_ENV} is not set (SIGTERM keeps its handler)")
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("Session started outside the main thread: SIGTERM is not turned into a drain")
            return
        self._drain = drain_mod.DrainRequest(Path(marker))
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """A drain (the drain file exists) only sets the flag; any other SIGTERM goes to the handler
        the script had, or ends the process as without one (ft_launcher stopping its workers)."""
        assert self._drain is not None
        marker = self._drain.marker
        previous = self._previous_sigterm
        if (marker is None or not marker.exists()) and callable(previous):
            previous(signum, frame)
            return
        self._drain.handle_sigterm(signum, frame)

    def _finish(self) -> None:
        """The block ended normally: this rank's saves written (the last one committed, on the
        committing rank), then the final report."""
        manager = self._ckpt
        if manager is not None:
            manager.wait(timeout=self._commit_timeout)
            last = self._last_saved
            if (
                last is not None
                and manager.is_committer
                and not manager.wait_committed(last, timeout=self._commit_timeout)
            ):
                log.error("the checkpoint of step %d did not commit", last)
            manager.poll()
            manager.refresh()
        self._note_committed()
        self._progress.finished = True
        self._report(force=True)

    def _failed(self, error: BaseException) -> None:
        """The block ended with an exception: count it against the node if it blames the node, note
        the step it failed after (`failed_step`: its launcher compares the tries), report."""
        reason = self._node_faults.note(error) if self._node_faults is not None else None
        if reason is not None and self._node_faults is not None:
            log.warning("fault attributed to node %s: %s", self._node_faults.node, reason)
        if isinstance(error, Exception):  # not an exit, an interrupt or a drain's SystemExit
            failed_step.add_note(error, self._steps_done())
        self._report(force=True)

    def _steps_done(self) -> int:
        """The newest step this process finished, or resumed at before its first step."""
        resumed = self._resumed[0] if self._resumed is not None else 0
        return max(self._progress.step, resumed)

    def _close(self) -> None:
        if self._phase == _Phase.CLOSED:
            return
        self._phase = _Phase.CLOSED
        if self._ckpt is not None:
            self._ckpt.close()
        if self._drain is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm or signal.SIG_DFL)

    def _require_started(self) -> None:
        if self._phase != _Phase.STARTED:
            raise RuntimeError(
                f"the Session is not running: call its methods inside `with session:` (it is {self._phase})"
            )

    # -- reporting ------------------------------------------------------------------------------

    def _report(self, *, force: bool) -> None:
        if self._reporter is None:
            return
        if self._node_faults is not None:
            self._progress.node_faults = self._node_faults.summary()
        try:
            self._reporter.report(self._progress, force=force)
        except OSError as error:
            # Progress is advisory: a full or vanished volume must not stop training.
            if not self._report_failed:
                log.warning("progress not reported: %s", error)
                self._report_failed = True

    def _record_recovery(self, step: int) -> bool:
        """The first step after a restart ends the recovery: one event, reported at once."""
        if self._pending is None:
            return False
        pending, self._pending = self._pending, None
        resumed_step, source = self._resumed or (max(step - 1, 0), "checkpoint" if step > 1 else "scratch")
        event = progress_mod.RecoveryEvent(
            kind="InJobRestart",
            step=resumed_step,
            fault_time=pending.fault_time,
            recovered_time=time.time(),
            steps_lost=max(0, pending.fault_step - resumed_step),
            resumed_from=source,
        )
        self._progress.add_event(event)
        print(event.log_line(), flush=True)
        return True

    def _note_committed(self) -> None:
        last = self._ckpt.last_committed if self._ckpt is not None else None
        p = self._progress
        if last is not None and (p.last_checkpoint_step is None or last.step >= p.last_checkpoint_step):
            p.last_checkpoint_step, p.last_checkpoint_time = last.step, last.time

    # -- collectives and the checkpoint manager -------------------------------------------------

    def _agree_on_drain(self) -> bool:
        if self._drain is None:
            return False
        if _world_size() == 1:
            return self._drain.requested
        return self._drain.agreed(_collective_device())

    def _manager(self) -> CheckpointManager | None:
        """The checkpoint manager, made at the first save or load (the process group is up by then)."""
        if self._ckpt is not None or self._checkpoint_dir is None:
            return self._ckpt
        from rtj_trainer.library.checkpoint import CheckpointManager

        rank, world_size = _rank_and_world_size()
        self._ckpt = CheckpointManager(
            self._checkpoint_dir,
            rank=rank,
            world_size=world_size,
            asynchronous=self._env.checkpoint_mode == env_names.MODE_ASYNC,
            keep=self._env.checkpoint_keep,
            keepalive=self._keepalive,
        )
        return self._ckpt

    def _agreed_newest_step(self, manager: CheckpointManager) -> int:
        """The newest complete checkpoint, the same on every rank (-1: none); partial saves newer
        than it, left by the failed attempt, are discarded (their stale ``.done`` files would let
        the next save of the same step commit early)."""
        from rtj_trainer.library import checkpoint

        manager.wait(timeout=None)  # a save of this process still in flight may complete one
        if _world_size() == 1:
            found = checkpoint.newest_complete(manager.root, manager.world_size)
            step = -1 if found is None else found.step
        else:
            import torch
            import torch.distributed as dist

            newest = manager.newest_step() if manager.is_committer else -1
            agreed = torch.tensor([newest], dtype=torch.long, device=_collective_device())
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            step = int(agreed[0])
        if manager.is_committer:
            manager.discard_partials_after(step)
            _warn_other_world_size(manager, step)
        if _world_size() > 1:
            import torch.distributed as dist

            dist.barrier()  # no rank saves into a directory that rank 0 is still discarding
        return step


def _on_every_rank(true_here: bool) -> bool:
    """Whether `true_here` holds on every rank (one small all-reduce in a process group)."""
    if _world_size() == 1:
        return true_here
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if true_here else 0], dtype=torch.long, device=_collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(int(flag[0]))


def _loss_value(loss: SupportsFloat | None) -> float | None:
    """The loss as a float (a tensor's value without the autograd warning), or None."""
    if loss is None:
        return None
    detach = getattr(loss, "detach", None)
    return float(detach() if callable(detach) else loss)


def _pending_fault(prior: Mapping[str, Any] | None, now: float) -> _Pending | None:
    """A previous process of this node reported and did not finish: this one recovers from its end."""
    if prior is None or prior.get("finished", False):
        return None
    return _Pending(fault_time=_epoch(prior.get("time")) or now, fault_step=int(prior.get("step", 0)))


def _resumed_progress(
    prior: Mapping[str, Any] | None, node_rank: int, train_start: float, restart_count: int
) -> progress_mod.Progress:
    """This process's report, continuing the counters of the node's previous process (as rtj-train
    does): restarts, events, useful step seconds, samples and tokens (:meth:`Session.load` replaces the
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


_epoch = epoch_seconds


def _world_size() -> int:
    """The process group's size; 1 without one (torch not even imported: no process group)."""
    if "torch" not in sys.modules:
        return 1
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank_and_world_size() -> tuple[int, int]:
    """From the process group, else from the launcher's environment (a single rank without either)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1)


def _collective_device() -> torch.device:
    """Where a small tensor for the default process group lives: CUDA for NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _warn_other_world_size(manager: CheckpointManager, step: int) -> None:
    from rtj_trainer.library import checkpoint

    newest = checkpoint.newest_complete(manager.root)
    if newest is not None and newest.step > step:
        log.warning(
            "checkpoint of step %d is for %s ranks, not %d: not loaded",
            newest.step,
            newest.world_size,
            manager.world_size,
        )


def _split_state(state: object, path: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> object:
    """The state's skeleton (its structure and plain values, each tensor replaced by a reference),
    collecting the tensors into ``tensors``: a ``DTensor`` as its local shard."""
    import torch

    where = "/".join(path) or "the state"
    if isinstance(state, torch.Tensor):
        from torch.distributed.tensor import DTensor

        key = where
        while key in tensors:
            key += "'"
        tensors[key] = state.to_local() if isinstance(state, DTensor) else state
        return {_TENSOR_KEY: key}
    if isinstance(state, Mapping):
        out: dict[object, object] = {}
        for name, value in state.items():
            if not isinstance(name, str | int):
                raise TypeError(f"{where}: key {name!r} is a {type(name).__name__}; only str and int keys")
            out[name] = _split_state(value, (*path, str(name)), tensors)
        return out
    if isinstance(state, list | tuple):
        items = [_split_state(value, (*path, str(i)), tensors) for i, value in enumerate(state)]
        return items if isinstance(state, list) else tuple(items)
    if isinstance(state, _PLAIN_LEAVES):
        return state
    raise TypeError(
        f"{where} is a {type(state).__name__}: a checkpointed state holds tensors, numbers, strings, "
        "None, and dicts, lists and tuples of them"
    )


def _join_state(
    skeleton: object, tensors: Mapping[str, torch.Tensor], like: object, path: tuple[str, ...]
) -> Any:
    """The saved state back from its skeleton; each tensor placed like its counterpart in ``like``."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {_TENSOR_KEY}:
            return _placed(tensors[skeleton[_TENSOR_KEY]], like, path)
        peers = like if isinstance(like, Mapping) else {}
        return {k: _join_state(v, tensors, peers.get(k), (*path, str(k))) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        peers_seq = like if isinstance(like, list | tuple) and len(like) == len(skeleton) else None
        items = [
            _join_state(v, tensors, None if peers_seq is None else peers_seq[i], (*path, str(i)))
            for i, v in enumerate(skeleton)
        ]
        return items if isinstance(skeleton, list) else tuple(items)
    return skeleton


def _placed(saved: torch.Tensor, like: object, path: tuple[str, ...]) -> torch.Tensor:
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(like, DTensor):
        local = like.to_local()
        if local.shape != saved.shape:
            raise ValueError(
                f"{'/'.join(path)}: the saved shard has shape {tuple(saved.shape)}, the model's "
                f"{tuple(local.shape)} (a different sharding?)"
            )
        return DTensor.from_local(
            saved.to(local.device),
            like.device_mesh,
            like.placements,
            shape=like.shape,
            stride=like.stride(),
            run_check=False,
        )
    if isinstance(like, torch.Tensor):
        return saved.to(like.device)
    return saved
