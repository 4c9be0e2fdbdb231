"""Simulated nodes: instance profiles, and the Node object and status a kubelet posts.

The kubelet (``rtj_localcluster.kubelet``) registers its Node from ``node_object``, posts
``node_status`` through ``nodes/status`` and renews its Lease in ``kube-node-lease``. Everything that
follows from a node's health is Kubernetes' own: the controller manager's node lifecycle controller
marks a node whose Lease goes stale Ready=Unknown and taints it, the taint eviction controller
evicts pods by their tolerations, pod GC removes the pods of deleted nodes.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .client import now_micro, now_rfc3339

NODE_LEASE_NAMESPACE = "kube-node-lease"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_OS = "kubernetes.io/os"
LABEL_ARCH = "kubernetes.io/arch"
TAINT_OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
KUBELET_VERSION = "v1.36.3"
"""What the simulated kubelets report: the control plane's own version (no version skew)."""


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


@dataclass(frozen=True)
class Degradation:
    """A fault that leaves the node Ready: extra conditions (as node-problem-detector or the EKS node
    monitoring agent would set, e.g. ``{"type": "AcceleratedHardwareReady", "status": "False"}``) and
    lower allocatable resources (as a device plugin reports when a GPU falls off the bus)."""

    conditions: tuple[Mapping[str, str], ...] = ()
    allocatable: Mapping[str, str] = field(default_factory=dict)


def node_status(
    profile: NodeProfile,
    *,
    host_ip: str,
    kubelet_port: int,
    not_ready_message: str | None = None,
    degradation: Degradation | None = None,
) -> dict[str, Any]:
    """The status a healthy kubelet posts; with ``not_ready_message`` Ready is False (KubeletNotReady);
    with ``degradation`` its conditions are added and its allocatable replaces the profile's."""
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
    allocatable = dict(profile.resources)
    if degradation is not None:
        allocatable.update(degradation.allocatable)
        conditions += [
            {"reason": "Degraded", "message": "", **c, "lastHeartbeatTime": now, "lastTransitionTime": now}
            for c in degradation.conditions
        ]
    return {
        "capacity": dict(profile.resources),
        "allocatable": allocatable,
        "conditions": conditions,
        "addresses": [{"type": "InternalIP", "address": host_ip}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "architecture": host_arch(),
            "operatingSystem": "linux",
            "osImage": platform.platform(),
            "kernelVersion": platform.release(),
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "process://local",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def lease_object(name: str, node_uid: str) -> dict[str, Any]:
    """The node's heartbeat Lease in ``kube-node-lease``, owned by its Node (deleted with it)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NODE_LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}],
        },
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()},
    }


def ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in node.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition  # type: ignore[no-any-return]
    return None
