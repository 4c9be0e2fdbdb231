"""The job configurations that `rtj demo` and `rtj bench goodput` rehearse, in one place.

- The recommended one (README, docs/benchmarks.md's `full` mode): the `Supervisor` launcher with two
  hot spares and a memory copy of the state every step, in-process restart, async checkpoints. Every
  fault, the loss of worker 0's node included, is recovered in-process by the processes that survive
  it: the operator only refills the spares.
- The default one (`faultTolerance.launcher: FtLauncher`): NVRx's in-process restart for an exception
  or a hang, ft_launcher's in-job restart for a killed rank, the operator's pod replacement for a lost
  node; with `rendezvous.host: StorePod` (`DEFAULT_WITH_STORE_POD`) a store pod hosts the rendezvous,
  so worker 0's node can be the one lost; with `rendezvous.spares: Standby` too
  (`DEFAULT_WITH_STANDBY_SPARES`, NVRx 0.7 in the pods) a hot spare's ft_launcher waits in the
  rendezvous and takes a lost node's place in the next round: ft_launcher's in-job restart recovers
  the node loss, and no pod has to start first.

Each is a merge patch over the example job (`rehearsal.merge_patch`) with the layer each fault class
should be recovered by; `pods` counts what a configuration's job runs at once, one pod per node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rtj_operator import api

from rtj_demo.rehearsal import load_example, merge_patch
from rtj_demo.report import INTENDED_LAYER, LAYER_IN_JOB, LAYER_IN_PROCESS

SUPERVISOR = "Supervisor"
FT_LAUNCHER = "FtLauncher"
# spec.rendezvous.host: what hosts ft_launcher's rendezvous.
WORKER0 = api.RendezvousHost.WORKER0.value
STORE_POD = api.RendezvousHost.STORE_POD.value
# spec.rendezvous.spares: how FtLauncher's hot spares take part.
HOLD_NODE = api.SpareMode.HOLD_NODE.value
STANDBY = api.SpareMode.STANDBY.value
# The pods of a job with a store pod (Supervisor's, or FtLauncher's on rendezvous.host StorePod) beside
# its workers and spares: the store pod.
STORE_PODS = 1

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
DEFAULT_WITH_STORE_POD = Configuration(FT_LAUNCHER, {"rendezvous": {"host": STORE_POD}})
STANDBY_SPEC_PATCH: dict[str, Any] = {"hotSpares": 1, "rendezvous": {"host": STORE_POD, "spares": STANDBY}}
DEFAULT_WITH_STANDBY_SPARES = Configuration(
    FT_LAUNCHER, STANDBY_SPEC_PATCH, {**INTENDED_LAYER, "node-loss": LAYER_IN_JOB}
)
BY_LAUNCHER = {c.launcher: c for c in (RECOMMENDED, DEFAULT)}


def chosen(launcher: str, rendezvous_host: str = WORKER0, spares: str = HOLD_NODE) -> Configuration:
    """The configuration of a launcher; FtLauncher's with its rendezvous in a store pod, and its
    spares standing by in it, when asked (Supervisor always has a store pod)."""
    if launcher == FT_LAUNCHER and rendezvous_host == STORE_POD:
        return DEFAULT_WITH_STANDBY_SPARES if spares == STANDBY else DEFAULT_WITH_STORE_POD
    return BY_LAUNCHER[launcher]


def patched_spec(spec_patch: Mapping[str, Any]) -> api.ResilientTrainingJobSpec:
    """The spec of the job a merge patch over the example job describes, as the API parses it."""
    return api.parse_job(merge_patch(load_example(), {"spec": spec_patch})).spec


def stands_by(spec_patch: Mapping[str, Any]) -> bool:
    """Whether a merge patch over the example job has FtLauncher's spares stand by in the rendezvous
    (NVRx 0.7 or later in the pods)."""
    return patched_spec(spec_patch).rendezvous.spares is api.SpareMode.STANDBY


def has_store_pod(spec_patch: Mapping[str, Any]) -> bool:
    """Whether the job a merge patch over the example job describes runs a store pod (the API's rule)."""
    return api.has_store_pod(patched_spec(spec_patch))


def standby_capable_nvrx() -> bool:
    """Whether this interpreter's NVRx, which the local cluster's pods run, has standby nodes (0.7 on)."""
    from rtj_trainer.library import nvrx_compat

    return nvrx_compat.nvrx_version() >= nvrx_compat.NVRX_0_7


def of_patch(spec_patch: Mapping[str, Any]) -> Configuration:
    """The configuration of the launcher a merge patch over the example job names (the example's
    own, FtLauncher, when it names none), its spares standing by where the patch says so."""
    if stands_by(spec_patch):
        return DEFAULT_WITH_STANDBY_SPARES
    ft = spec_patch.get("faultTolerance") or {}
    return BY_LAUNCHER[ft.get("launcher", FT_LAUNCHER)]


def pods(spec_patch: Mapping[str, Any], job_nodes: int) -> int:
    """How many pods a job patched by `spec_patch` runs at once, each on a node of its own: the
    workers, the hot spares, and the store pod of a job that has one."""
    hot_spares = int(spec_patch.get("hotSpares") or 0)
    store = STORE_PODS if has_store_pod(spec_patch) else 0
    return job_nodes + hot_spares + store


def cluster_nodes(spec_patches: Sequence[Mapping[str, Any]], losses: int, job_nodes: int) -> int:
    """Nodes for running the jobs patched by `spec_patches` one after the other, each losing
    `losses` nodes: every node loss takes a node for good, so the i-th run finds the losses of the
    runs before it gone, and needs a node per pod of its job plus one to replace each node it loses;
    one more node is slack (a pod still leaving a node)."""
    needed = (i * losses + pods(patch, job_nodes) + losses for i, patch in enumerate(spec_patches))
    return max(needed, default=0) + 1
