"""The operator's state, handed to every kopf handler as its `memo`: API client, queue, indexes.

`handlers` fills the indexes (kopf's, kept here so that passes started outside a handler, such as a
requeue wake-up, can read them); `job_pass` reads them and the API client; `queue` runs the passes.
`api_liveness` records whether the API server answers (the liveness endpoint reads it); `elector`, when
leader election is on, says whether this replica may act (`acting`). `job_pass.new_context` builds
one with its queue wired to the passes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf

from rtj_operator import events
from rtj_operator.decide import conditions as cond
from rtj_operator.fsx_policy import FsxAllowList
from rtj_operator.nodehealth import NodeHealth
from rtj_operator.runtime.api_liveness import ApiLiveness
from rtj_operator.runtime.kube import Kube
from rtj_operator.runtime.leader import LeaderElector
from rtj_operator.runtime.queue import JobKey, WorkQueue
from rtj_operator.runtime.scrape import ProgressScraper


@dataclass
class OperatorContext:
    """The operator's state, passed to every handler as kopf's `memo`."""

    kube: Kube
    metrics_port: int | None = None
    api_liveness: ApiLiveness = field(default_factory=ApiLiveness)
    elector: LeaderElector | None = None
    # kopf's watch settings (see handlers.configure): how long a silent watch is trusted.
    watch_inactivity_seconds: float = 15.0
    # Which signals beyond Ready make a worker's node unfit (the operator's --node-health setting).
    node_health: NodeHealth = field(default_factory=NodeHealth)
    # The FSx file systems each namespace's jobs may mount (`--allow-fsx`; empty: none).
    fsx_allowed: FsxAllowList = field(default_factory=FsxAllowList)
    queue: WorkQueue = field(init=False)
    # The trainers' newest progress reports, read from their pods' endpoints (see runtime.scrape).
    progress: ProgressScraper = field(default_factory=ProgressScraper)
    # Filled by kopf (see handlers.remember_indexes).
    jobs: kopf.Index[JobKey, dict[str, Any]] | None = None
    pods: kopf.Index[JobKey, dict[str, Any]] | None = None
    nodes: kopf.Index[str, dict[str, Any]] | None = None

    # kopf copies the memo into each handler's kwargs; it must behave like a kopf.Memo (a dict-like).
    def __copy__(self) -> OperatorContext:
        return self

    def acting(self) -> bool:
        """Whether this replica may write: always without leader election, else while it leads."""
        return self.elector is None or self.elector.holds()

    def job_body(self, key: JobKey) -> dict[str, Any] | None:
        """The job as last indexed, or None."""
        store: Iterable[dict[str, Any]] | None = self.jobs.get(key) if self.jobs is not None else None
        return next(iter(store), None) if store is not None else None

    def job_pods(self, key: JobKey) -> list[dict[str, Any]]:
        """The job's pods as last indexed."""
        return list(self.pods.get(key, ()) if self.pods is not None else ())

    def all_nodes(self) -> list[dict[str, Any]]:
        """Every node as last indexed."""
        if self.nodes is None:
            return []
        return [body for store in self.nodes.values() for body in store]

    def jobs_waiting_for_nodes(self) -> list[JobKey]:
        """The jobs blocked because too few nodes could hold their workers (a node may change that)."""
        return [
            key for key, store in (self.jobs or {}).items() if any(_waiting_for_nodes(body) for body in store)
        ]

    def jobs_on_node(self, node: str) -> list[JobKey]:
        """The jobs with a pod bound to `node`."""
        return [
            key
            for key, store in (self.pods or {}).items()
            if any(pod.get("spec", {}).get("nodeName") == node for pod in store)
        ]


def _waiting_for_nodes(body: dict[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict)
        and c.get("type") == cond.COND_BLOCKED
        and c.get("status") == "True"
        and c.get("reason") == events.INSUFFICIENT_NODES
        for c in conditions
    )
