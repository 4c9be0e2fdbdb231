"""The progress contract (trainer -> operator; docs/architecture.md, "Progress contract"): where a
pod serves its newest report, and the report's version."""

from __future__ import annotations

from typing import Final

# Every report's "v": the operator reads the reports of this version and ignores others.
SCHEMA_VERSION: Final = 1
# Each worker pod's progress endpoint: rtj-launch serves the report and its Prometheus metrics
# there (RTJ_PROGRESS_PORT's default, the container port `progress`); the operator reads the report.
PORT: Final = 9410
# The container port's name under which the operator finds the endpoint (the renderer names it).
PORT_NAME: Final = "progress"
PATH: Final = "/progress"
METRICS_PATH: Final = "/metrics"
