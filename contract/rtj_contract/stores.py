"""The store pod's ports (``rendezvous.host: StorePod``, ``faultTolerance.launcher: Supervisor``): it
serves from the job's ``rendezvous.port`` on, and the operator declares the same ports on its
container that ``rtj-store`` listens on and the ranks dial."""

from __future__ import annotations

from typing import Final

# As offsets from the port: in-process restart's wrapper store (under FtLauncher, ft_launcher's
# rendezvous), and under Supervisor the process groups' store that outlives the in-process iterations.
WRAPPER_STORE_OFFSET: Final = 0
PG_STORE_OFFSET: Final = 1
