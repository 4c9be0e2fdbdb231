"""The library's session: what a training script of one's own calls, behind the public facade.

``rtj_trainer.Session`` (re-exported by ``rtj_trainer/__init__.py``; docs/library.md is its
reference) brings a user's FSDP or DDP loop the parts of ``rtj-train`` that the operator reads or
acts on, built from the same modules of ``rtj_trainer.library``: progress reports (``progress``: step,
loss, goodput, the checkpoint save cost behind the checkpoint advice, restarts and recovery events),
the async sharded checkpoints with their atomic commit (``checkpoint``), drains on SIGTERM
(``drain``), faults blamed on the node (``node_faults``) and a named fault reason in the termination
message.

``Session`` is the block's life cycle and the public methods; its parts are modules of their own:
``session_progress`` (what the session reports, carried on from the node's previous process),
``session_checkpoints`` (a state dict saved and loaded through the checkpoint manager, with
``state_tree`` splitting it into tensors and a skeleton) and ``collectives`` (the few agreements
across ranks). ``SessionDrain``, here, turns the pod's SIGTERM into a drain agreed per step.

Nothing here imports torch at import time: the session imports it when a checkpoint is saved or
loaded, or when a process group is initialized for a collective. Outside a pod (no ``rtj-launch``
environment) the session reports nothing and, without a checkpoint directory, saves nothing, and it
says so once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final, NoReturn, SupportsFloat

from rtj_contract import env as env_names
from rtj_contract import termination

from rtj_trainer.library import collectives, finite_loss
from rtj_trainer.library import drain as drain_mod
from rtj_trainer.library import env as env_mod
from rtj_trainer.library.session_checkpoints import SessionCheckpoints
from rtj_trainer.library.session_progress import SessionProgress

log = logging.getLogger("rtj_trainer.session")

# Kubernetes keeps at most 4096 bytes of a termination message.
MAX_FAULT_MESSAGE_CHARS: Final = 1024


class _Phase:
    NEW: Final = "new"
    STARTED: Final = "started"
    CLOSED: Final = "closed"


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
        self._local_rank = 0
        self._reporting = SessionProgress()
        self._checkpoints = self._checkpoints_in(None)  # none before the block starts
        self._drain = SessionDrain()

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
                self._reporting.failed(exc)
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
        self._reporting.step_done(step, value, samples=samples, tokens=tokens)
        force = self._reporting.record_recovery(step)
        self._drain.agree()
        if self._checkpoints.poll():
            force = True
        self._reporting.note_committed(self._checkpoints.last_committed)
        self._reporting.report(force=force)

    @property
    def draining(self) -> bool:
        """Whether the job asked this world to drain (the pod's SIGTERM on any rank, agreed by
        :meth:`step`): then call :meth:`drain` with the step just done."""
        return self._drain.draining

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
        blocking = self._checkpoints.save(step, state_dict, self._reporting.checkpoint_extra())
        if blocking is not None:
            self._reporting.saved(blocking)

    def load(self, *, like: Mapping[str, Any] | None = None) -> tuple[int, dict[str, Any] | None]:
        """The newest complete checkpoint: ``(step, state)``, or ``(0, None)`` when there is none.

        Every rank calls it (with a process group of more than one rank, the ranks agree on the
        step). The state has the structure that was saved, with this rank's tensors on the CPU;
        ``like`` (the state dict of the freshly built model and optimizer, same structure) puts
        each tensor where its counterpart is: on its device, and as a ``DTensor`` of the same mesh
        and placements where the counterpart is one (FSDP2).
        """
        self._require_started()
        if self._checkpoints.directory is None:
            self._reporting.resumed = (0, "scratch")
            return 0, None
        restored = self._checkpoints.load(like)
        if restored is None:
            self._reporting.resumed_from(0, None)
            return 0, None
        self._reporting.resumed_from(restored.step, (restored.info, restored.extra))
        return restored.step, restored.state

    def checkpoint_saved(self, step: int, *, blocking_seconds: float | None = None) -> None:
        """Tell the operator about a checkpoint the script made itself, complete at ``step``.

        ``blocking_seconds``: how long the save held up training (the checkpoint advice's save
        cost). Call it on every rank (local rank 0 of each pod reports it; :meth:`drain` without a
        state counts it on each rank).
        """
        self._require_started()
        self._reporting.checkpoint_made(step, blocking_seconds)
        self._checkpoints.own_checkpoint = step
        self._reporting.report(force=True)

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
        request = self._drain.request
        if request is None or not self._drain.draining:
            raise RuntimeError("drain() is for a drain: call it when session.draining is True")
        committed = self._checkpoints.commit(
            step, None if state_dict is None else lambda: self.save(step, state_dict)
        )
        self._reporting.progress.step = max(self._reporting.progress.step, step)
        self._reporting.note_committed(self._checkpoints.last_committed)
        if committed:
            request.record_committed_step(step)
        self._reporting.report(force=True)
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
        _write_fault_reason(reason, message)

    # -- start and end --------------------------------------------------------------------------

    def _start(self, environ: Mapping[str, str]) -> None:
        self._env = env_mod.TrainerEnv.from_environ(environ)
        self._local_rank = int(environ.get("LOCAL_RANK") or 0)
        directory = self._checkpoint_dir_arg or environ.get(env_names.CHECKPOINT_DIR) or None
        self._checkpoints = self._checkpoints_in(directory)
        missing = self._reporting.start(environ, self._env, directory, self._local_rank)
        if directory is None:
            missing.append(
                f"checkpoints: {env_names.CHECKPOINT_DIR} is not set and no checkpoint_dir was given "
                "(save() does nothing, load() starts from scratch)"
            )
        self._drain.install(environ, missing)
        if missing and self._local_rank == 0:
            log.warning("rtj_trainer: not in an rtj-launch pod: %s", "; ".join(missing))
        self._phase = _Phase.STARTED
        self._reporting.clock.restart()

    def _checkpoints_in(self, directory: str | None) -> SessionCheckpoints:
        return SessionCheckpoints(
            directory, self._env, keepalive=self._keepalive, commit_timeout=self._commit_timeout
        )

    def _finish(self) -> None:
        """The block ended normally: this rank's saves written (the last one committed, on the
        committing rank), then the final report."""
        self._checkpoints.finish()
        self._reporting.note_committed(self._checkpoints.last_committed)
        self._reporting.progress.finished = True
        self._reporting.report(force=True)

    def _close(self) -> None:
        if self._phase == _Phase.CLOSED:
            return
        self._phase = _Phase.CLOSED
        self._checkpoints.close()
        self._drain.uninstall()

    def _require_started(self) -> None:
        if self._phase != _Phase.STARTED:
            raise RuntimeError(
                f"the Session is not running: call its methods inside `with session:` (it is {self._phase})"
            )


class SessionDrain:
    """A session's drains: the pod's SIGTERM (with the drain file there) requests one, and every rank
    agrees on it at each step; any other SIGTERM goes to the handler the script had."""

    def __init__(self) -> None:
        self.request: drain_mod.DrainRequest | None = None
        self.draining = False  # agreed at the newest step: some rank was asked to drain
        self._previous_sigterm: Any = None

    def install(self, environ: Mapping[str, str], missing: list[str]) -> None:
        marker = environ.get(drain_mod.DRAIN_FILE_ENV, "")
        if not marker:
            missing.append(f"drains: {drain_mod.DRAIN_FILE_ENV} is not set (SIGTERM keeps its handler)")
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("Session started outside the main thread: SIGTERM is not turned into a drain")
            return
        self.request = drain_mod.DrainRequest(Path(marker))
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """A drain (the drain file exists) only sets the flag; any other SIGTERM goes to the handler
        the script had, or ends the process as without one (ft_launcher stopping its workers)."""
        assert self.request is not None
        marker = self.request.marker
        previous = self._previous_sigterm
        if (marker is None or not marker.exists()) and callable(previous):
            previous(signum, frame)
            return
        self.request.handle_sigterm(signum, frame)

    def agree(self) -> bool:
        """Whether any rank was asked to drain, the same on every rank (a collective in a process
        group): :attr:`draining` from now on."""
        if self.request is None:
            self.draining = False
        elif collectives.world_size() == 1:
            self.draining = self.request.requested
        else:
            self.draining = self.request.agreed(collectives.collective_device())
        return self.draining

    def uninstall(self) -> None:
        """The script's SIGTERM handler back (or the default one)."""
        if self.request is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm or signal.SIG_DFL)


def _write_fault_reason(reason: str, message: str) -> None:
    """The termination message of :meth:`Session.fault`, or a log line outside a pod."""
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


def _loss_value(loss: SupportsFloat | None) -> float | None:
    """The loss as a float (a tensor's value without the autograd warning), or None."""
    if loss is None:
        return None
    detach = getattr(loss, "detach", None)
    return float(detach() if callable(detach) else loss)
