"""Heartbeats to ft_launcher's rank monitor: ``rtj_trainer.Heartbeats``, behind the public facade.

Under ft_launcher (``FT_RANK_MONITOR_IPC_SOCKET`` set) each rank's NVRx ``RankMonitorClient``
tells the launcher it is alive; a rank that falls silent for ``heartbeatTimeoutSeconds`` is taken
for hung and every worker restarts (docs/trainer.md). Outside ft_launcher (a test, a laptop,
``rtj-train`` run by hand) there is no monitor and every call does nothing, so a script uses the
same lines everywhere. The reference trainer uses it as a user's script does; ``Session``'s
``keepalive`` takes :meth:`Heartbeats.keepalive` so a rank waiting on a slow checkpoint volume keeps
beating. NVRx is imported only when a monitor is there; nothing here imports torch.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final

FT_IPC_ENV: Final = "FT_RANK_MONITOR_IPC_SOCKET"
# A keepalive from a wait loop beats at most this often: the monitor needs one per timeout, which is
# tens of seconds at the least.
KEEPALIVE_INTERVAL_SECONDS: Final = 1.0


class Heartbeats:
    """This rank's heartbeats to ft_launcher's rank monitor, or nothing outside ft_launcher.

    Create it once per process; :meth:`connect` once the process group exists (and again after an
    in-process restart rebuilt it), :meth:`beat` once per step, :meth:`close` at the end.
    """

    def __init__(self) -> None:
        self._client: Any = None
        self._last_beat = 0.0
        if os.environ.get(FT_IPC_ENV):
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

            self._client = RankMonitorClient()

    @property
    def enabled(self) -> bool:
        """Whether ft_launcher's rank monitor is there (the calls below do something)."""
        return self._client is not None

    def connect(self) -> None:
        """(Re)connect to the monitor: after the process group exists, and after each in-process
        restart (a new iteration of the wrapped function)."""
        if self._client is None:
            return
        if self._client.is_initialized:
            self._client.shutdown_workload_monitoring()
        self._client.init_workload_monitoring()

    def beat(self) -> None:
        """One heartbeat (once connected): call it once per step."""
        if self._client is not None and self._client.is_initialized:
            self._client.send_heartbeat()
            self._last_beat = time.monotonic()

    def keepalive(self) -> None:
        """A heartbeat from a wait loop, at most one a second: ``Session(keepalive=heartbeats.keepalive)``."""
        if time.monotonic() - self._last_beat >= KEEPALIVE_INTERVAL_SECONDS:
            self.beat()

    def close(self) -> None:
        """Disconnect from the monitor (the process is finishing)."""
        if self._client is not None and self._client.is_initialized:
            self._client.shutdown_workload_monitoring()
