"""The one place that touches NVRx internals or version-specific names.

NVRx 0.4.1 is the newest release that installs on the Python 3.11 development machines; the GPU image
pins a newer one on Python 3.12. Everything that differs between releases, or that reaches past the
public API to work on CPU, lives here: the async checkpoint writer (``rtj_trainer.library.checkpoint`` uses
it) and ft_launcher's flags and environment (``rtj_trainer.runtime.launch``). The heartbeat client, on
NVRx's public API alone, is the library's ``heartbeats``; in-process restart, which NVRx deprecated in
0.6, is ``nvrx_inprocess``, the one module that imports it.

Two releases are supported and tested on every run (docs/trainer.md has the table of differences):
0.4.1, installed in the development environment, and 0.7.0, the image's, whose pure-Python modules
the test suite puts on the path (scripts/install-nvrx-0.7.0.sh). A branch on the release exists only
where 0.7.0 changed behaviour the trainer depends on; each says why.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import signal
from collections.abc import Mapping
from importlib import metadata
from typing import Any, Final

import torch

NVRX_DISTRIBUTION: Final = "nvidia-resiliency-ext"


def nvrx_version() -> tuple[int, ...]:
    try:
        raw = metadata.version(NVRX_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return (0, 0, 0)
    parts: list[int] = []
    for piece in raw.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


# ---------------------------------------------------------------------------------------------
# ft_launcher flags. 0.4.1 spells the NIC monitor switch --ft-enable-nic-monitor (the older
# --ft-param-enable-nic-monitor spelling warns); the restart policy flag --ft-restart-policy
# exists from 0.4 on. 0.7.0 keeps the names but parses the heartbeat timeouts as strings (converted
# later; "null" means none), so the values are always formatted as plain numbers.
#
# The config file: --ft-cfg-path on both releases (0.4.1 also takes the deprecated
# --fault-tol-cfg-path, gone in 0.7.0). Both read it with FaultToleranceConfig.from_yaml_file: a
# YAML document with a `fault_tolerance:` mapping (at the top or nested; a file without one is
# silently ignored), whose keys are FaultToleranceConfig's fields (rank_section_timeouts,
# rank_out_of_section_timeout, ...; unknown keys are ignored). Every --ft-* flag given on the command
# line (or with a default other than None, such as --ft-enable-nic-monitor on 0.4.1) overrides the
# file's value for that field (FaultToleranceConfig.from_args).
# ---------------------------------------------------------------------------------------------

NVRX_0_7: Final = (0, 7, 0)

# Seconds between SIGTERM and SIGKILL when ft_launcher stops its workers to restart them: 30 in
# 0.4.1, 15 in 0.7.0. The trainer installs no SIGTERM handler, so a healthy worker exits at once;
# only a worker stuck in the kernel or the driver waits this long. 15 on both releases, so that
# recovery figures compare and a hang costs the same everywhere.
WORKERS_STOP_TIMEOUT_SECONDS: Final = 15


def ft_launcher_flags(version: tuple[int, ...] | None = None) -> Mapping[str, str]:
    """Flag names for ``rtj_trainer.runtime.launch``, by the installed (or given) NVRx version."""
    _ = version if version is not None else nvrx_version()
    return {
        "initial_heartbeat_timeout": "--ft-initial-rank-heartbeat-timeout",
        "heartbeat_timeout": "--ft-rank-heartbeat-timeout",
        "nic_monitor": "--ft-enable-nic-monitor",
        "config_path": "--ft-cfg-path",
    }


# The variable 0.7.0's rendezvous reads, in ft_launcher's own environment, for a node's
# infrastructure rank (nvidia_resiliency_ext.fault_tolerance.utils.get_infrastructure_rank: after
# the SLURM variables, none of which a pod has). 0.7.0 has no flag for it (no
# --ft-use-infra-group-rank): its barrier rendezvous always orders the nodes by infrastructure rank,
# and without one it assigns them in the order of their node descriptors (address, pid). ft_launcher
# sets GROUP_RANK afresh in each worker's environment, so this one reaches no training process.
INFRA_RANK_ENV: Final = "GROUP_RANK"


def ft_launcher_environment(node_rank: int, version: tuple[int, ...] | None = None) -> dict[str, str]:
    """Variables for ft_launcher's own environment, so that worker ``node_rank`` holds group rank
    ``node_rank`` while all the job's workers take part in the rendezvous.

    0.7.0: the infrastructure rank (:data:`INFRA_RANK_ENV`). 0.4.1 has no such notion: its c10d
    rendezvous gives each node the rank it held in the previous round and fills the rest in the
    sorted order of the node descriptors (``<address>_<pid>_<n>``), so the group rank follows the
    pods' addresses, not their worker index, and nothing is set.
    """
    release = version if version is not None else nvrx_version()
    if release >= NVRX_0_7:
        return {INFRA_RANK_ENV: str(node_rank)}
    return {}


def ft_launcher_tuning(*, cpu: bool, version: tuple[int, ...] | None = None) -> list[str]:
    """ft_launcher options whose defaults differ between releases, each set deliberately.

    * NIC monitor (link_downed counters polled during training): on by default in 0.4.1, off in
      0.7.0. On GPU nodes it stays on for both, so that a NIC losing its link restarts the node's
      workers instead of waiting for a collective timeout; CPU machines have no RDMA NICs.
    * NIC link-state check before each rendezvous (0.7.0 only, on by default): kept on GPU nodes (a
      node whose NIC went down fails its rendezvous and the operator replaces it), off on CPU.
    * Wait for GPU memory to drain before workers restart (0.7.0 only, up to 50 s): kept on GPU
      nodes, where a new worker would otherwise run out of memory next to a dying one; 0 (off) on
      CPU, which has no GPU memory to wait for and no NVML to ask.
    * Progress tracking (0.7.0 only with --ft-checkpoint-iteration-file) is not enabled: the
      operator judges progress from the trainer's progress reports.
    """
    release = version if version is not None else nvrx_version()
    names = ft_launcher_flags(release)
    args = [f"--workers-stop-timeout={WORKERS_STOP_TIMEOUT_SECONDS}"]
    args.append(f"{names['nic_monitor']}={'false' if cpu else 'true'}")
    if release >= NVRX_0_7 and cpu:
        args += ["--ft-enable-nic-healthcheck=false", "--ft-gpu-memory-reclaim-timeout=0"]
    return args


# ---------------------------------------------------------------------------------------------
# Async checkpoint writer: NVRx TorchAsyncCheckpoint with a persistent writer process.
# ---------------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG: Final = 1
_writer_state = {"prepared": False}


def _prepare_writer_process() -> None:
    """Runs inside the writer: die with the trainer instead of lingering as an orphan."""
    if _writer_state["prepared"]:
        return
    _writer_state["prepared"] = True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def write_shard_durably(state: Any, path: str) -> None:
    """The writer's function: torch.save, then fsync, so a finalized save is on disk.

    Module-level so the spawned writer process imports it by name.
    """
    _prepare_writer_process()
    if path == os.devnull:
        return  # the warm-up request that starts the writer process ahead of the first save
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


# The writer's nice value where the release sets one (0.7.0's default, kept): on GPU nodes the host
# cores feed the GPUs (data loading, kernel launches) and a save may take longer; on a busy CPU-only
# machine it does (the kill-during-save test: 80 s against 67 s at nice 0, measured).
WRITER_NICE: Final = 10


def writer_caller_kwargs(caller_class: Any) -> dict[str, Any]:
    """``PersistentAsyncCaller`` arguments for the parameters the installed release has (0.7.0).

    ``cpu_shm_mode=True``: without it the 0.7.0 writer selects ``rank % torch.cuda.device_count()``
    as its CUDA device: a ZeroDivisionError on a machine without a GPU, and on GPU nodes a CUDA
    context per writer that it never uses, since the trainer hands it CPU shared-memory tensors (the
    staging buffer). 0.4.1's writer never touches CUDA. ``cpu_priority``: ``WRITER_NICE``.
    """
    accepted = inspect.signature(caller_class.__init__).parameters
    kwargs: dict[str, Any] = {}
    if "cpu_shm_mode" in accepted:
        kwargs["cpu_shm_mode"] = True
    if "cpu_priority" in accepted:
        kwargs["cpu_priority"] = WRITER_NICE
    return kwargs


class AsyncWriter:
    """One rank's NVRx async writer: submit a save, poll it, notice when the writer died.

    Wraps ``TorchAsyncCheckpoint(persistent_queue=True)``. Its ``async_save`` calls
    ``torch.cuda.synchronize()`` unconditionally and its caller asks ``torch.distributed`` for the
    rank, and its blocking finalize waits forever on a dead writer; so requests are scheduled on
    its queue directly, the synchronize is guarded, and completion is only ever polled.
    """

    def __init__(self, rank: int) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import PersistentAsyncCaller
        from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint

        self._ckpt: Any = TorchAsyncCheckpoint(persistent_queue=True)
        queue = self._ckpt._async_calls_queue
        queue.persistent_caller = PersistentAsyncCaller(**writer_caller_kwargs(PersistentAsyncCaller))
        queue.persistent_caller.rank = rank
        self._queue: Any = queue

    def start(self) -> None:
        """Start the writer process now (spawning it takes seconds) instead of in the first save.

        It starts with SIGTERM blocked and its first request installs the drain-aware handler
        (``rtj_trainer.library.drain``): a drain's SIGTERM, which reaches the rank's whole process group,
        must not kill the writer that saves the drain's checkpoint.
        """
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest

        from rtj_trainer.library import drain

        if self._queue.persistent_caller.process is None:
            with drain.sigterm_blocked():
                self._queue.schedule_async_request(AsyncRequest(drain.adopt_writer_process, (), [], {}))

    def submit(self, state: Any, path: str) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest

        self.start()
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
        self._queue.schedule_async_request(AsyncRequest(write_shard_durably, (state, path), [], {}))

    def pending(self) -> int:
        return int(self._queue.get_num_unfinalized_calls())

    def poll(self) -> bool:
        """Finalize what finished; True when nothing is pending any more."""
        if self.pending():
            self._queue.maybe_finalize_async_calls(blocking=False, no_dist=True)
        return self.pending() == 0

    def writer_alive(self) -> bool:
        process = self._queue.persistent_caller.process
        return process is not None and bool(process.is_alive())

    def writer_pid(self) -> int | None:
        process = self._queue.persistent_caller.process
        return int(process.pid) if process is not None else None

    def close(self) -> None:
        """Stop the writer; a dead one is forgotten, since joining its queue would block forever."""
        caller = self._queue.persistent_caller
        if caller.process is not None and caller.process.is_alive() and self.pending() == 0:
            caller.close()
        else:
            if caller.process is not None and caller.process.is_alive():
                caller.process.kill()
                caller.process.join(timeout=10)
            caller.process = None
        self._queue.async_calls.clear()
