"""NVRx's in-process restart (``nvidia_resiliency_ext.inprocess``): the one module that imports it.

NVRx 0.6 deprecated in-process restart ("migrate to in-job restart via ft_launcher"); 0.4.1 and
0.7.0, the two releases the project supports, still ship it, and the project builds on it in three
places: ``wrap_in_process`` (the library's, for scripts of one's own), ``rtj-train``'s wrapper, and
the Supervisor launcher's fixed world of active and reserve ranks (``rtj_trainer.reference.restart``:
its abort, health check, rank assignment and store client subclass the classes :func:`in_process_layer`
returns). Everything else reaches the layer through here, and a test keeps it so. The facade
exports ``in_process_layer``, ``in_process_available`` and ``InProcessUnavailableError`` for code
that builds on the layer as ``rtj-train`` does.

When a release removes it (the fallback, docs/trainer.md "NVRx releases"):

- :func:`in_process_available` is False and :func:`in_process_layer` raises
  :class:`InProcessUnavailableError`, whose message names the way out:
  ``faultTolerance.inProcess.enabled: false`` with the ``FtLauncher`` launcher, so that every fault
  is recovered by ft_launcher's in-job restart or by the operator;
- ``wrap_in_process(fn, enabled=False)`` and ``rtj-train`` with in-process restart off run the
  training function once, without the wrapper: nothing else of a job changes;
- what needs the layer (in-process restart on, the Supervisor launcher) stops at its start with
  that message, instead of failing in the middle of a run.

The keyword arguments each release's ``Wrapper`` accepts and the checks 0.7.0 runs before a restart
are handled here too (they were ``nvrx_compat``'s). Nothing runs at import time.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Final, Optional

DEPRECATED_SINCE: Final = (0, 6, 0)
FALLBACK: Final = (
    "set spec.faultTolerance.inProcess.enabled: false and spec.faultTolerance.launcher: FtLauncher "
    "(faults are then recovered by ft_launcher's in-job restart and by the operator)"
)


class InProcessUnavailableError(RuntimeError):
    """The installed NVRx release has no in-process restart; the message says what to do instead."""


def in_process_layer() -> Any:
    """``nvidia_resiliency_ext.inprocess``, or :class:`InProcessUnavailableError` naming the fallback."""
    try:
        from nvidia_resiliency_ext import inprocess
    except ImportError as error:
        from rtj_trainer.library import nvrx_compat

        version = ".".join(str(part) for part in nvrx_compat.nvrx_version())
        raise InProcessUnavailableError(
            f"NVRx {version} has no in-process restart (nvidia_resiliency_ext.inprocess, deprecated "
            f"since {'.'.join(map(str, DEPRECATED_SINCE))}): {FALLBACK}"
        ) from error
    return inprocess


def layer_module(name: str) -> Any:
    """One of the layer's own modules (``store``, ``attribution``), for a tool that makes the
    wrapper's store calls without the wrapper (``bench/store_scale.py``); raises as
    :func:`in_process_layer` does."""
    return importlib.import_module(f"{in_process_layer().__name__}.{name}")


def in_process_available() -> bool:
    """Whether the installed NVRx release still ships in-process restart."""
    try:
        in_process_layer()
    except InProcessUnavailableError:
        return False
    return True


def wrap(fn: Callable[[Any], int], requested: Mapping[str, Any], *, cuda: bool) -> Callable[[], int]:
    """``fn`` under ``inprocess.Wrapper(**requested)``, as ``rtj_trainer.wrap_in_process`` says."""
    layer = in_process_layer()
    wrapper = layer.Wrapper(**wrapper_kwargs(layer, requested))
    limit_restart_health_check(wrapper, requested.get("health_check"), cuda=cuda)
    return wrapped_entry(layer, wrapper, fn)


def wrapper_kwargs(layer: Any, requested: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the keyword arguments the installed ``inprocess.Wrapper`` accepts.

    Releases add and rename tuning knobs; a knob the installed release lacks falls back to its
    default rather than failing the job.
    """
    accepted = inspect.signature(layer.Wrapper.__init__).parameters
    return {k: v for k, v in requested.items() if k in accepted}


def wrapped_entry(layer: Any, wrapper: Any, fn: Callable[[Any], int]) -> Callable[[], int]:
    """``wrapper(fn)`` where ``fn(call_wrapper)`` receives the ``CallWrapper`` (None when disabled).

    The wrapper finds the parameter to fill by its annotation, evaluated with ``issubclass``: string
    annotations (``from __future__ import annotations``) break it, so the signature is set explicitly.
    """

    def entry(call_wrapper: Any = None) -> int:
        return fn(call_wrapper)

    parameter = inspect.Parameter(
        "call_wrapper",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=None,
        annotation=Optional[layer.CallWrapper],  # noqa: UP045 - the wrapper matches typing.Union
    )
    entry.__signature__ = inspect.Signature([parameter])  # type: ignore[attr-defined]
    wrapped: Callable[[], int] = wrapper(entry)
    return wrapped


def limit_restart_health_check(wrapper: Any, health_check: Any, *, cuda: bool) -> None:
    """Decide what the wrapper checks before an in-process restart.

    0.7.0's ``Wrapper`` runs ``restart_health_check`` after a fault: the given health check chained
    with NVML GPU, NVLink and NIC checks whenever LOCAL_RANK is set (always, under ft_launcher).
    0.4.1 runs only the given one. On GPU nodes the NVML checks stay: a GPU that needs a reset or a
    NIC whose link went down cannot be fixed by restarting the function, so the failed check hands
    the fault to ft_launcher (and, if it persists, to the operator). Without CUDA there is no NVML
    to ask and the checks would fail every restart, so only the given health check runs.
    """
    if cuda or not hasattr(wrapper, "restart_health_check"):
        return
    wrapper.restart_health_check = health_check
