"""The trainer: FSDP training under NVRx async checkpoints, in-process restart and ft_launcher.

Modules: ``env`` (the operator's environment contract), ``launch`` (``rtj-launch``: ft_launcher
argv, the pod's main process), ``train`` (``rtj-train``: the loop under the in-process wrapper),
``restart`` (wrapper, abort, budget), ``checkpoint`` (sharded async saves with an atomic commit),
``faults`` (``RTJ_FAULTS``), ``progress`` (the progress report), ``endpoint`` (the pod's progress
endpoint), ``metrics`` (the trainer's Prometheus metrics), ``model`` (the workload), ``nvrx_compat``
(NVRx versions).
"""

import os as _os
import warnings as _warnings

# Set before torch is first imported (every submodule imports it). c10d's store client logs a
# warning each time a polling wait times out, which the in-process wrapper does every few
# milliseconds; NVRx imports pynvml, which warns on every import.
_os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
_warnings.filterwarnings("ignore", category=FutureWarning, message=".*pynvml.*")
