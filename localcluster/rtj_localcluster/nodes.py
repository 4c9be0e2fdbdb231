"""Simulated nodes: instance profiles, the Node object a kubelet registers, and the node lifecycle
controller (heartbeat leases -> Ready=Unknown, NoExecute taints, taint-based eviction, pod GC).

The kubelet (``rtj_localcluster.kubelet``) registers its Node from ``node_object`` and renews its
Lease in ``kube-node-lease``. ``NodeLifecycleController`` plays kube-controller-manager's part: a
node whose lease is older than the grace period gets ``Ready=Unknown`` (reason NodeStatusUnknown)
and the ``node.kubernetes.io/unreachable`` taints (``not-ready`` for ``Ready=False``); pods on it
that do not tolerate a NoExecute taint are evicted after their ``tolerationSeconds`` (deleted, with
a ``DisruptionTarget/DeletionByTaintManager`` condition). As in Kubernetes, an evicted pod on a dead
node stays Terminating until it is force-deleted, its Node is deleted (then pod GC removes it), or
the node, not Ready, gets the ``node.kubernetes.io/out-of-service`` taint (non-graceful node
shutdown: pod GC force-deletes its terminating pods). The eviction decision is the pure
``eviction_due``.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .client import ApiError, Informer, KubeClient, now_rfc3339, parse_time, path_for, run_level_triggered
from .scheduler import TAINT_NOT_READY, TAINT_UNREACHABLE, toleration_matches

log = logging.getLogger(__name__)

NODE_LEASE_NAMESPACE = "kube-node-lease"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
TAINT_OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")


@dataclass(frozen=True)
class NodeProfile:
    """The simulated machine: what the Node advertises (capacity == allocatable)."""

    instance_type: str
    resources: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)


PROFILES: dict[str, NodeProfile] = {
    # An EKS p5.48xlarge: 8 H100, 32 EFA adapters, 192 vCPU, 2 TiB; hugepages for EFA.
    "p5.48xlarge": NodeProfile(
        "p5.48xlarge",
        {
            "cpu": "192",
            "memory": "2Ti",
            "nvidia.com/gpu": "8",
            "vpc.amazonaws.com/efa": "32",
            "hugepages-2Mi": "10Gi",
            "ephemeral-storage": "28Ti",
            "pods": "110",
        },
        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    ),
    # A plain machine for CPU-only runs (the processes share the host's real cores anyway).
    "cpu": NodeProfile(
        "cpu",
        {"cpu": "16", "memory": "64Gi", "hugepages-2Mi": "0", "ephemeral-storage": "100Gi", "pods": "110"},
    ),
}


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def node_object(
    name: str,
    profile: NodeProfile,
    *,
    zone: str = "local-1a",
    gpu_taint: bool = False,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The Node a kubelet registers (status is posted separately, through nodes/status)."""
    all_labels = {
        LABEL_INSTANCE_TYPE: profile.instance_type,
        "beta.kubernetes.io/instance-type": profile.instance_type,
        LABEL_ZONE: zone,
        LABEL_HOSTNAME: name,
        LABEL_OS: "linux",
        LABEL_ARCH: host_arch(),
        **profile.labels,
        **(labels or {}),
    }
    all_taints = [dict(t) for t in taints]
    if gpu_taint:
        all_taints.append(dict(GPU_TAINT))
    spec: dict[str, Any] = {"providerID": f"rtj-local:///{name}"}
    if all_taints:
        spec["taints"] = all_taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
    }


def node_status(
    profile: NodeProfile, *, host_ip: str, not_ready_message: str | None = None
) -> dict[str, Any]:
    """The status a healthy kubelet posts; with ``not_ready_message`` Ready is False (KubeletNotReady)."""
    now = now_rfc3339()
    conditions = []
    for kind in NODE_CONDITIONS:
        if kind == "Ready":
            ready = not_ready_message is None
            status, reason = ("True", "KubeletReady") if ready else ("False", "KubeletNotReady")
            message = "kubelet is posting ready status" if ready else str(not_ready_message)
        else:
            status, reason = "False", f"KubeletHasSufficient{kind.replace('Pressure', '')}"
            message = f"kubelet has no {kind}"
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        )
    return {
        "capacity": dict(profile.resources),
        "allocatable": dict(profile.resources),
        "conditions": conditions,
        "addresses": [{"type": "InternalIP", "address": host_ip}],
        "nodeInfo": {
            "architecture": host_arch(),
            "operatingSystem": "linux",
            "osImage": platform.platform(),
            "kernelVersion": platform.release(),
            "kubeletVersion": "v1.32.0-rtj-local",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "process://local",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition  # type: ignore[no-any-return]
    return None


def desired_condition_taints(node: Mapping[str, Any], now: str) -> list[dict[str, Any]]:
    """The node's taints with the not-ready/unreachable ones set to match its Ready condition."""
    ready = ready_condition(node)
    status = (ready or {}).get("status", "Unknown")
    wanted_key = {"False": TAINT_NOT_READY, "Unknown": TAINT_UNREACHABLE}.get(status)
    current = [dict(t) for t in node.get("spec", {}).get("taints") or []]
    kept = [
        t
        for t in current
        if t.get("key") not in (TAINT_NOT_READY, TAINT_UNREACHABLE) or t.get("key") == wanted_key
    ]
    if wanted_key:
        for effect in ("NoSchedule", "NoExecute"):
            if not any(t.get("key") == wanted_key and t.get("effect") == effect for t in kept):
                taint: dict[str, Any] = {"key": wanted_key, "effect": effect}
                if effect == "NoExecute":
                    taint["timeAdded"] = now
                kept.append(taint)
    return kept


def eviction_due(pod: Mapping[str, Any], taints: Sequence[Mapping[str, Any]], now: datetime) -> float | None:
    """Seconds until the taint manager evicts ``pod`` (<= 0: now), or None if it is never evicted.

    Each NoExecute taint must be tolerated; a toleration without ``tolerationSeconds`` tolerates it
    forever, otherwise the pod may stay that many seconds after the taint's ``timeAdded``.
    """
    tolerations = pod.get("spec", {}).get("tolerations") or []
    deadline: float | None = None
    for taint in taints:
        if taint.get("effect") != "NoExecute":
            continue
        matching = [t for t in tolerations if toleration_matches(t, taint)]
        if not matching:
            return 0.0
        bounded = [t["tolerationSeconds"] for t in matching if t.get("tolerationSeconds") is not None]
        if len(bounded) < len(matching):
            continue  # some toleration tolerates it forever
        added = parse_time(taint.get("timeAdded")) or now
        remaining = (added - now).total_seconds() + max(0, min(int(s) for s in bounded))
        deadline = remaining if deadline is None else min(deadline, remaining)
    return deadline


class NodeLifecycleController:
    """Marks silent nodes Unknown, taints them, evicts pods by taint, and collects orphaned pods."""

    def __init__(
        self,
        client: KubeClient,
        nodes: Informer,
        leases: Informer,
        pods: Informer,
        *,
        grace_seconds: float,
        period_seconds: float = 0.5,
        pod_gc_delay_seconds: float = 2.0,
    ) -> None:
        self._client = client
        self._nodes = nodes
        self._leases = leases
        self._pods = pods
        self._grace = grace_seconds
        self._period = period_seconds
        self._pod_gc_delay = pod_gc_delay_seconds
        self._wake = asyncio.Event()
        self._evicted: set[str] = set()
        self._missing_since: dict[str, float] = {}
        nodes.subscribe(self._wake.set)
        pods.subscribe(self._wake.set)

    async def run(self) -> None:
        await run_level_triggered(
            "node lifecycle",
            (self._nodes, self._leases, self._pods),
            self._wake,
            self.sync,
            period_seconds=self._period,
        )

    async def sync(self) -> None:
        now = datetime.now(UTC)
        for node in self._nodes.items():
            await self._monitor_node(node, now)
        await self._evict_pods(now)
        await self._collect_orphans()

    async def _monitor_node(self, node: Mapping[str, Any], now: datetime) -> None:
        name = node["metadata"]["name"]
        lease = self._leases.get(name, NODE_LEASE_NAMESPACE)
        renewed = parse_time((lease or {}).get("spec", {}).get("renewTime")) or parse_time(
            node["metadata"].get("creationTimestamp")
        )
        ready = ready_condition(node)
        silent = renewed is None or (now - renewed).total_seconds() > self._grace
        if silent and (ready is None or ready.get("status") != "Unknown"):
            stamp = now_rfc3339()
            conditions = []
            for condition in node.get("status", {}).get("conditions") or []:
                updated = dict(condition)
                if updated.get("status") != "Unknown":
                    updated["lastTransitionTime"] = stamp
                updated.update(
                    status="Unknown",
                    reason="NodeStatusUnknown",
                    message="Kubelet stopped posting node status.",
                )
                conditions.append(updated)
            if not conditions:
                conditions = [
                    {
                        "type": "Ready",
                        "status": "Unknown",
                        "reason": "NodeStatusUnknown",
                        "message": "Kubelet stopped posting node status.",
                        "lastTransitionTime": stamp,
                    }
                ]
            log.info("node %s: no heartbeat for %.1fs, marking Ready=Unknown", name, self._grace)
            node = await self._patch_node(name, {"status": {"conditions": conditions}}, "status") or node
        taints = desired_condition_taints(node, now_rfc3339())
        if taints != list(node.get("spec", {}).get("taints") or []):
            await self._patch_node(name, {"spec": {"taints": taints or None}})

    async def _patch_node(self, name: str, body: dict[str, Any], subresource: str | None = None) -> Any:
        try:
            return await self._client.patch(path_for("nodes", name=name, subresource=subresource), body)
        except ApiError as error:
            if error.status != 404:
                raise
            return None

    async def _evict_pods(self, now: datetime) -> None:
        taints_by_node = {
            n["metadata"]["name"]: [
                t for t in n.get("spec", {}).get("taints") or [] if t.get("effect") == "NoExecute"
            ]
            for n in self._nodes.items()
        }
        for pod in self._pods.items():
            meta = pod["metadata"]
            taints = taints_by_node.get(pod.get("spec", {}).get("nodeName") or "")
            if not taints or meta.get("deletionTimestamp") or meta.get("uid") in self._evicted:
                continue
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            due = eviction_due(pod, taints, now)
            if due is None or due > 0:
                continue
            self._evicted.add(meta.get("uid", ""))
            log.info("evicting pod %s/%s from tainted node", meta["namespace"], meta["name"])
            await self._delete_pod(
                pod, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint", None
            )
        live = {p["metadata"].get("uid") for p in self._pods.items()}
        self._evicted &= live

    async def _collect_orphans(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self._nodes.items()}
        out_of_service = {
            name
            for name, node in nodes.items()
            if (ready_condition(node) or {}).get("status") != "True"
            and any(t.get("key") == TAINT_OUT_OF_SERVICE for t in node.get("spec", {}).get("taints") or [])
        }
        clock = time.monotonic()
        missing: set[str] = set()
        for pod in self._pods.items():
            node_name = pod.get("spec", {}).get("nodeName")
            if node_name in out_of_service and pod["metadata"].get("deletionTimestamp"):
                # Non-graceful node shutdown: an admin (or operator) declared the node gone, so
                # its terminating pods are force-deleted, as the pod GC controller does.
                await self._delete_pod(pod, "DeletionByPodGC", "PodGC: node is out of service", 0)
                continue
            if not node_name or node_name in nodes:
                continue
            missing.add(node_name)
            first = self._missing_since.setdefault(node_name, clock)
            # A pod may be seen bound before its new Node reaches the cache: wait a little.
            if clock - first < self._pod_gc_delay:
                continue
            await self._delete_pod(pod, "DeletionByPodGC", "PodGC: node no longer exists", 0)
        self._missing_since = {n: t for n, t in self._missing_since.items() if n in missing}

    async def _delete_pod(self, pod: Mapping[str, Any], reason: str, message: str, grace: int | None) -> None:
        meta = pod["metadata"]
        conditions = [
            c for c in pod.get("status", {}).get("conditions") or [] if c.get("type") != "DisruptionTarget"
        ]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        try:
            await self._client.patch(
                path_for("pods", meta["namespace"], meta["name"], "status"),
                {"status": {"conditions": conditions}},
            )
            await self._client.delete(
                path_for("pods", meta["namespace"], meta["name"]), grace_period_seconds=grace
            )
        except ApiError as error:
            if error.status != 404:
                raise
        if reason == "DeletionByTaintManager":
            await self._client.post_event(
                pod,
                "Normal",
                "TaintManagerEviction",
                f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
                component="taint-eviction-controller",
            )
