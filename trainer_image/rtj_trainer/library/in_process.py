"""In-process restarts for a script of one's own: ``rtj_trainer.wrap_in_process``, behind the facade.

NVRx's ``inprocess.Wrapper`` restarts a training function in the same interpreter on every rank
when any rank raises, hangs or falls silent (``spec.faultTolerance.inProcess``). Using it directly
means knowing how the NVRx releases the project supports differ (``nvrx_inprocess``: the keyword
arguments each accepts, how the wrapper finds the parameter it passes its ``CallWrapper`` to, the
NVML checks 0.7.0 runs before a restart, which fail on a machine without CUDA, and what to do on a
release that no longer has in-process restart, which NVRx deprecated in 0.6). This module is that
knowledge behind one public function; ``rtj-train``'s wrapper (``rtj_trainer.reference.restart``)
is built on it as a user's is. Nothing here runs at import time; NVRx and torch are imported on the
first call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def wrap_in_process(fn: Callable[[Any], int], /, **wrapper_kwargs: Any) -> Callable[[], int]:
    """``fn`` under NVRx's ``inprocess.Wrapper(**wrapper_kwargs)``: calling the result runs
    ``fn(call_wrapper)`` until it returns, restarting it in this interpreter after a fault.

    ``call_wrapper`` is NVRx's ``CallWrapper`` (``None`` when the wrapper is disabled with
    ``enabled=False``), whatever the annotations of ``fn``. A keyword argument the installed NVRx
    release does not accept is dropped (it keeps its default there) rather than failing the job.
    Without CUDA, NVRx 0.7.0's NVML GPU, NVLink and NIC checks before a restart are left out (there
    is no NVML to ask): only ``health_check``, when given, runs.

    NVRx deprecated in-process restart in 0.6. On a release without it, ``enabled=False`` runs
    ``fn(None)`` once, without the wrapper, and anything else raises ``InProcessUnavailableError``
    naming the fallback (``nvrx_inprocess``).
    """
    import torch

    from rtj_trainer.library import nvrx_inprocess

    if wrapper_kwargs.get("enabled") is False and not nvrx_inprocess.in_process_available():
        return functools.partial(fn, None)
    return nvrx_inprocess.wrap(fn, wrapper_kwargs, cuda=torch.cuda.is_available())
