"""Hollow pods: the pods bound to hollow nodes go through their phases without processes. A pod bound
to a live hollow node is reported Running with a pod IP and every container running and ready; its
stand-in trainer (``standin``) joins its job's world and serves the progress endpoint; a deleted pod
ends at once (its stand-in answers SIGTERM immediately) and is removed with grace 0, as a kubelet
does; a pod whose world finished Succeeds. A lost node's pods get nothing more: their stand-ins stop
serving and they stay as the API server has them, as a dead machine's pods do."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..client import ApiError, KubeClient, now_rfc3339, path_for
from ..podenv import condition
from ..podnet import IpAllocator
from .leases import HOST_IP, NodeLeases, bounded
from .standin import FINAL_REPORT_WAIT_SECONDS, Endpoint, World, WorldShape, node_rank, progress_port

log = logging.getLogger(__name__)

RUNNING_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")


@dataclass
class HollowPod:
    uid: str
    namespace: str
    name: str
    node: str
    ip: str
    world: World
    endpoint: Endpoint | None
    started_at: str
    ended: bool = False
    deleting: bool = False


def owner_uid(pod: Mapping[str, Any]) -> str:
    """The pod's controller's uid (its job), else its own."""
    metadata = pod.get("metadata", {})
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid"))
    return str(metadata.get("uid"))


def container_statuses(pod: Mapping[str, Any], started_at: str, exit_code: int | None) -> dict[str, Any]:
    """Every container running (or terminated with `exit_code`); init containers completed."""
    spec = pod.get("spec", {})

    def one(container: Mapping[str, Any], state: dict[str, Any], ready: bool) -> dict[str, Any]:
        return {
            "name": container.get("name"),
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"hollow://{pod['metadata']['uid']}/{container.get('name')}",
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "state": state,
        }

    def terminated(code: int) -> dict[str, Any]:
        reason = "Completed" if code == 0 else "Error"
        return {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": started_at,
                "finishedAt": now_rfc3339(),
            }
        }

    main_state = {"running": {"startedAt": started_at}} if exit_code is None else terminated(exit_code)
    statuses: dict[str, Any] = {
        "containerStatuses": [one(c, main_state, exit_code is None) for c in spec.get("containers") or []]
    }
    if spec.get("initContainers"):
        statuses["initContainerStatuses"] = [one(c, terminated(0), False) for c in spec["initContainers"]]
    return statuses


def pod_status(
    pod: Mapping[str, Any], ip: str, started_at: str, exit_code: int | None = None
) -> dict[str, Any]:
    now = now_rfc3339()
    running = exit_code is None
    phase = "Running" if running else ("Succeeded" if exit_code == 0 else "Failed")
    conditions = [
        condition(
            kind, running or kind in ("PodScheduled", "Initialized"), now, None if running else "PodCompleted"
        )
        for kind in RUNNING_CONDITIONS
    ]
    return {
        "phase": phase,
        "conditions": conditions,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": started_at,
        **container_statuses(pod, started_at, exit_code),
    }


class HollowPods:
    """The hollow nodes' pods, kept by one level-triggered pass over the cluster's pod informer."""

    def __init__(self, client: KubeClient, leases: NodeLeases, ips: IpAllocator, step_seconds: float) -> None:
        self.client = client
        self.leases = leases
        self.ips = ips
        self.step_seconds = step_seconds
        self.pods: dict[str, HollowPod] = {}
        self.worlds: dict[str, World] = {}

    async def sync(self, items: list[dict[str, Any]]) -> None:
        now = time.time()
        mine = [pod for pod in items if pod.get("spec", {}).get("nodeName") in self.leases.nodes]
        seen = {str(pod["metadata"]["uid"]) for pod in mine}
        for uid in set(self.pods) - seen:
            await self._forget(uid, now)
        await bounded(
            (
                self._sync_pod(pod, str(pod["metadata"]["uid"]), str(pod["spec"]["nodeName"]), now)
                for pod in mine
            ),
            self.leases.concurrency,
        )

    async def _sync_pod(self, pod: dict[str, Any], uid: str, node: str, now: float) -> None:
        record = self.pods.get(uid)
        if not self.leases.live(node):
            if record is not None and record.endpoint is not None:
                await self._stop(record, now)  # the machine is gone, and its processes with it
            return
        if pod["metadata"].get("deletionTimestamp"):
            await self._delete(pod, record, uid, now)
        elif record is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            await self._start(pod, uid, node, now)
        elif record is not None and not record.ended and self._exits(record, now):
            record.ended = True
            await self._write_status(record, pod_status(pod, record.ip, record.started_at, exit_code=0))
            await self._stop(record, now)

    @staticmethod
    def _exits(record: HollowPod, now: float) -> bool:
        """The world finished and the member's last report was read (or nobody came for it)."""
        if not record.world.finished(now):
            return False
        read = record.endpoint is None or record.endpoint.final_report_read
        return read or record.world.finished_for(now) > FINAL_REPORT_WAIT_SECONDS

    async def _start(self, pod: dict[str, Any], uid: str, node: str, now: float) -> None:
        world = self.worlds.setdefault(owner_uid(pod), World(WorldShape.of(pod, self.step_seconds)))
        metadata = pod["metadata"]
        record = HollowPod(
            uid,
            metadata["namespace"],
            metadata["name"],
            node,
            self.ips.allocate(),
            world,
            None,
            now_rfc3339(),
        )
        self.pods[uid] = record
        port = progress_port(pod)
        if port is not None:
            record.endpoint = Endpoint(world, uid)
            try:
                await record.endpoint.start(record.ip, port)
            except OSError as error:
                log.warning(
                    "hollow pod %s/%s: progress endpoint %s:%d: %s",
                    record.namespace,
                    record.name,
                    record.ip,
                    port,
                    error,
                )
                record.endpoint = None
            world.join(uid, node_rank(pod, len(world.members)), now)
        await self._write_status(record, pod_status(pod, record.ip, record.started_at))

    async def _delete(self, pod: dict[str, Any], record: HollowPod | None, uid: str, now: float) -> None:
        if record is not None:
            if record.deleting:
                return
            record.deleting = True
            await self._stop(record, now)
        try:
            await self.client.delete(
                path_for("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]),
                grace_period_seconds=0,
                uid=uid,
            )
        except ApiError as error:
            if error.status not in (404, 409):
                log.warning("hollow pod %s: delete failed: %s", pod["metadata"]["name"], error)
                if record is not None:
                    record.deleting = False  # tried again next pass

    async def _stop(self, record: HollowPod, now: float) -> None:
        record.world.leave(record.uid, now)
        if record.endpoint is not None:
            await record.endpoint.close()
            record.endpoint = None

    async def _forget(self, uid: str, now: float) -> None:
        record = self.pods.pop(uid)
        await self._stop(record, now)
        world_key = next((key for key, world in self.worlds.items() if world is record.world), None)
        if world_key is not None and not any(p.world is record.world for p in self.pods.values()):
            del self.worlds[world_key]

    async def _write_status(self, record: HollowPod, status: dict[str, Any]) -> None:
        try:
            await self.client.patch(
                path_for("pods", record.namespace, record.name, "status"),
                {"metadata": {"uid": record.uid}, "status": status},
            )
        except ApiError as error:
            if error.status not in (404, 409):
                log.warning(
                    "hollow pod %s/%s: status update failed: %s", record.namespace, record.name, error
                )

    async def close(self) -> None:
        now = time.time()
        for record in self.pods.values():
            await self._stop(record, now)
