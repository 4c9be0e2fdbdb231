"""The job configurations that `rtj demo` and `rtj bench goodput` rehearse, in one place.

- The recommended one (README, docs/benchmarks.md's `full` mode): the `Supervisor` launcher with two
  hot spares and a memory copy of the state every step, in-process restart, async checkpoints. Every
  fault, the loss of worker 0's node included, is recovered in-process by the processes that survive
  it: the operator only refills the spares.
- The default one (`faultTolerance.launcher: FtLauncher`): NVRx's in-process restart for an exception
  or a hang, ft_launcher's in-job restart for a killed rank, the operator's pod replacement for a lost
  node.

Each is a merge patch over the example job (`rehearsal.merge_patch`) with the layer each fault class
should be recovered by; `pods` counts what a configuration's job runs at once, one pod per node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rtj_demo.report import INTENDED_LAYER, LAYER_IN_PROCESS

SUPERVISOR = "Supervisor"
FT_LAUNCHER = "FtLauncher"
# The pods of a Supervisor job beside its workers and spares: the store pod.
SUPERVISOR_STORE_PODS = 1

RECOMMENDED_SPEC_PATCH: dict[str, Any] = {
    "hotSpares": 2,
    "faultTolerance": {"launcher": SUPERVISOR, "inProcess": {"enabled": True}},
    "checkpoint": {"mode": "Async", "memoryIntervalSteps": 1},
}


@dataclass(frozen=True)
class Configuration:
    """A launcher's job as the rehearsals run it."""

    launcher: str
    spec_patch: Mapping[str, Any] = field(default_factory=dict)
    intended: Mapping[str, str] = field(default_factory=lambda: dict(INTENDED_LAYER))


RECOMMENDED = Configuration(
    SUPERVISOR, RECOMMENDED_SPEC_PATCH, {kind: LAYER_IN_PROCESS for kind in INTENDED_LAYER}
)
DEFAULT = Configuration(FT_LAUNCHER)
BY_LAUNCHER = {c.launcher: c for c in (RECOMMENDED, DEFAULT)}


def of_patch(spec_patch: Mapping[str, Any]) -> Configuration:
    """The configuration of the launcher a merge patch over the example job names (the example's
    own, FtLauncher, when it names none)."""
    ft = spec_patch.get("faultTolerance") or {}
    return BY_LAUNCHER[ft.get("launcher", FT_LAUNCHER)]


def pods(spec_patch: Mapping[str, Any], job_nodes: int) -> int:
    """How many pods a job patched by `spec_patch` runs at once, each on a node of its own: the
    workers, the hot spares, and a Supervisor job's store pod."""
    hot_spares = int(spec_patch.get("hotSpares") or 0)
    store = SUPERVISOR_STORE_PODS if of_patch(spec_patch).launcher == SUPERVISOR else 0
    return job_nodes + hot_spares + store


def cluster_nodes(spec_patches: Sequence[Mapping[str, Any]], losses: int, job_nodes: int) -> int:
    """Nodes for running the jobs patched by `spec_patches` one after the other, each losing
    `losses` nodes: every node loss takes a node for good, so the i-th run finds the losses of the
    runs before it gone, and needs a node per pod of its job plus one to replace each node it loses;
    one more node is slack (a pod still leaving a node)."""
    needed = (i * losses + pods(patch, job_nodes) + losses for i, patch in enumerate(spec_patches))
    return max(needed, default=0) + 1
