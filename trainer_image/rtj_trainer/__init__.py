"""rtj_trainer: the library a training script imports, the pod runtime, and the project's trainer.

The public part is this module's ``__all__`` and nothing else (docs/library.md): a ``Session`` that
a user's own FSDP or DDP script creates once and runs its loop in, so the operator shows its step,
loss, checkpoints, goodput and checkpoint advice, and a drain commits the current step, and
``Heartbeats`` to ft_launcher's rank monitor (nothing outside ft_launcher); ``JobSettings``, the
job's settings read-only; ``NodeFaults``, the faults counted against the node; ``wrap_in_process``,
NVRx's in-process restarts across its releases, and ``in_process_layer``, ``in_process_available``
and ``InProcessUnavailableError`` for code that builds on that layer (NVRx deprecated it in 0.6);
the Supervisor launcher's ``WORLD_*`` store keys and exit status; and the building blocks a session
is made of, for a loop that drives them itself as ``rtj-train`` does: ``CheckpointManager``,
``DrainRequest`` and ``install_drain_handler``, ``Progress``, ``RecoveryEvent``, ``Reporter``,
``load_node_state`` and ``train_start_time``::

    import rtj_trainer

    with rtj_trainer.Session() as session:
        start, state = session.load()
        ...
        session.step(step, loss=loss)

Importing it does nothing else: no torch, no threads, no environment reads. The names are loaded
on first use (``CheckpointManager`` imports torch then); a name on its way out warns
(``DeprecationWarning``) for one minor release first.

Everything else is private to the project, in four parts (docs/trainer.md, "Modules"), each a
subpackage whose ``__init__`` says what it may import (tests/trainer/test_trainer_layout.py holds it):

* ``library``: this facade's implementation (``library.session``) and what the other parts share
  with it (the environment contract, progress, checkpoints, drains, NVRx compatibility);
* ``runtime``: the pod runtime (``rtj-launch``, the rank shim, the progress endpoint, ``rtj-store``);
* ``reference``: the reference trainer (``rtj-train``, its in-process restarts and memory tier);
* ``rehearsal``: fault injection (``RTJ_FAULTS``) and the checkpoint drill.
"""

import importlib as _importlib
import os as _os
import typing as _typing
import warnings as _warnings

# Set before torch is first imported (every submodule imports it). c10d's store client logs a
# warning each time a polling wait times out, which the in-process wrapper does every few
# milliseconds; NVRx imports pynvml, which warns on every import.
_os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
_warnings.filterwarnings("ignore", category=FutureWarning, message=".*pynvml.*")

if _typing.TYPE_CHECKING:
    from rtj_trainer.library.checkpoint import CheckpointManager
    from rtj_trainer.library.drain import DrainRequest, install_drain_handler
    from rtj_trainer.library.env import JobSettings
    from rtj_trainer.library.finite_loss import NonFiniteLossError
    from rtj_trainer.library.heartbeats import Heartbeats
    from rtj_trainer.library.in_process import wrap_in_process
    from rtj_trainer.library.node_faults import NodeFaults
    from rtj_trainer.library.nvrx_inprocess import (
        InProcessUnavailableError,
        in_process_available,
        in_process_layer,
    )
    from rtj_trainer.library.progress import (
        Progress,
        RecoveryEvent,
        Reporter,
        load_node_state,
        train_start_time,
    )
    from rtj_trainer.library.session import Session
    from rtj_trainer.library.world import WORLD_BROKEN_EXIT_CODE, WORLD_FINISHED_KEY, WORLD_FORMED_KEY

    LIBRARY_VERSION: str
    __version__: str

__all__ = [
    "LIBRARY_VERSION",
    "WORLD_BROKEN_EXIT_CODE",
    "WORLD_FINISHED_KEY",
    "WORLD_FORMED_KEY",
    "CheckpointManager",
    "DrainRequest",
    "Heartbeats",
    "InProcessUnavailableError",
    "JobSettings",
    "NodeFaults",
    "NonFiniteLossError",
    "Progress",
    "RecoveryEvent",
    "Reporter",
    "Session",
    "__version__",
    "in_process_available",
    "in_process_layer",
    "install_drain_handler",
    "load_node_state",
    "train_start_time",
    "wrap_in_process",
]

# Public name -> the private module that defines it.
_EXPORTS: dict[str, str] = {
    "CheckpointManager": "rtj_trainer.library.checkpoint",
    "DrainRequest": "rtj_trainer.library.drain",
    "Heartbeats": "rtj_trainer.library.heartbeats",
    "InProcessUnavailableError": "rtj_trainer.library.nvrx_inprocess",
    "JobSettings": "rtj_trainer.library.env",
    "NodeFaults": "rtj_trainer.library.node_faults",
    "NonFiniteLossError": "rtj_trainer.library.finite_loss",
    "Progress": "rtj_trainer.library.progress",
    "RecoveryEvent": "rtj_trainer.library.progress",
    "Reporter": "rtj_trainer.library.progress",
    "Session": "rtj_trainer.library.session",
    "WORLD_BROKEN_EXIT_CODE": "rtj_trainer.library.world",
    "WORLD_FINISHED_KEY": "rtj_trainer.library.world",
    "WORLD_FORMED_KEY": "rtj_trainer.library.world",
    "in_process_available": "rtj_trainer.library.nvrx_inprocess",
    "in_process_layer": "rtj_trainer.library.nvrx_inprocess",
    "install_drain_handler": "rtj_trainer.library.drain",
    "load_node_state": "rtj_trainer.library.progress",
    "train_start_time": "rtj_trainer.library.progress",
    "wrap_in_process": "rtj_trainer.library.in_process",
}
# Deprecated name -> (the name that replaces it, the release that removes it). A deprecated name
# keeps working and warns for one minor release; docs/library.md's changelog lists it.
_DEPRECATED: dict[str, tuple[str, str]] = {}


def _library_version() -> str:
    """The progress contract's library version (``rtj_trainer.library.progress``): the reports carry it."""
    from rtj_trainer.library import progress

    return progress.LIBRARY_VERSION


def __getattr__(name: str) -> _typing.Any:
    if name in ("LIBRARY_VERSION", "__version__"):
        return _library_version()
    if name in _DEPRECATED:
        replacement, removal = _DEPRECATED[name]
        _warnings.warn(
            f"rtj_trainer.{name} is deprecated and goes in {removal}: use rtj_trainer.{replacement}",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(replacement)
    if name in _EXPORTS:
        return getattr(_importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rtj_trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
