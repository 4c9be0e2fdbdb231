"""A pod's volumes made real on this machine, as a kubelet's volume manager does: emptyDir (a
memory-backed one under the pod's short temporary directory), hostPath, the volume bound to a claim,
ConfigMap and Secret files, projected service-account tokens and the downward API.

A volume whose ConfigMap or Secret does not exist yet waits (ContainerCreating, a FailedMount Event),
as does a claim that is not bound yet; the reads go through the node's own identity, retried while
the Node authorizer does not know yet that the pod is bound here."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from . import identity
from .client import ApiError, KubeClient, path_for
from .podenv import field_ref_value


class MissingVolumeSourceError(RuntimeError):
    """A ConfigMap or Secret a pod's volume needs (and does not mark optional) does not exist."""

    def __init__(self, volume: str, kind: str, name: str) -> None:
        super().__init__(f'MountVolume.SetUp failed for volume "{volume}": {kind.lower()} "{name}" not found')


async def with_authorization_retry(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call``, retried while the Node authorizer does not yet know the pod is bound here: its
    graph follows the pod's binding a moment later, and a real kubelet retries too."""
    for attempt in range(50):
        try:
            return await call()
        except ApiError as error:
            if error.status != 403 or attempt == 49:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def get_optional(client: KubeClient, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or None when it does not exist."""
    path = path_for(resource, namespace, name)
    try:
        result: dict[str, Any] = await with_authorization_retry(lambda: client.get(path))
        return result
    except ApiError as error:
        if error.status == 404:
            return None
        raise


def write_files(target: Path, obj: Mapping[str, Any], *, decode: bool, items: Any) -> None:
    """A ConfigMap's or Secret's keys as files under `target` (only `items`, renamed, when given)."""
    target.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        files[key] = base64.b64decode(value) if decode else str(value).encode()
    for key, value in (obj.get("binaryData") or {}).items():
        files[key] = base64.b64decode(value)
    if items:
        files = {item.get("path", item["key"]): files[item["key"]] for item in items if item["key"] in files}
    for relative, content in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def host_path(source: Mapping[str, Any]) -> str:
    host = Path(source["path"])
    if source.get("type") in ("DirectoryOrCreate", None, "") and not host.exists():
        with contextlib.suppress(OSError):
            host.mkdir(parents=True, exist_ok=True)
    return str(host)


def volume_directory(pv: Mapping[str, Any], state_dir: Path) -> Path:
    """Where a PV's data lives on this machine: its hostPath/local path, else a directory per PV
    (CSI volumes such as FSx for Lustre map there)."""
    spec = pv.get("spec", {})
    for key in ("hostPath", "local"):
        if spec.get(key, {}).get("path"):
            path = Path(spec[key]["path"])
            break
    else:
        path = state_dir / "volumes" / pv["metadata"]["name"]
    path.mkdir(parents=True, exist_ok=True)
    return path


class PodVolumes:
    """Mounts one pod's volumes: `mount_all` gives each volume's directory by name.

    `waiting(message, event_reason)` tells the pod's containers why they still wait to be created
    (and records a Warning Event with `event_reason` when one is given)."""

    def __init__(
        self,
        pod: Mapping[str, Any],
        *,
        client: KubeClient,
        state_dir: Path,
        pod_dir: Path,
        tmp_dir: Path | None,
        pod_ip: str,
        host_ip: str,
        waiting: Callable[[str, str | None], None],
    ) -> None:
        self.pod = pod
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.client = client
        self.state_dir = state_dir
        self.pod_dir = pod_dir
        self.tmp_dir = tmp_dir
        self.pod_ip = pod_ip
        self.host_ip = host_ip
        self.waiting = waiting

    async def mount_all(self, into: dict[str, str]) -> None:
        """Each volume of the pod, in order, into `into` (volume name -> directory)."""
        for volume in self.pod.get("spec", {}).get("volumes") or []:
            into[volume["name"]] = await self._mount_when_sources_exist(volume)

    async def _get_optional(self, resource: str, name: str) -> dict[str, Any] | None:
        return await get_optional(self.client, resource, self.namespace, name)

    async def _mount_when_sources_exist(self, volume: Mapping[str, Any]) -> str:
        """Like a kubelet, wait (ContainerCreating, a FailedMount event) while a ConfigMap or Secret
        the volume needs does not exist yet: the root CA ConfigMap of a new namespace, for one,
        is published by the controller manager a moment after the namespace appears."""
        delay = 0.5
        while True:
            try:
                return await self._prepare_volume(volume)
            except MissingVolumeSourceError as missing:
                self.waiting(str(missing), "FailedMount")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 8.0)

    async def _prepare_volume(self, volume: Mapping[str, Any]) -> str:
        name = volume["name"]
        own = self.pod_dir / "volumes" / name
        if "emptyDir" in volume:
            medium = (volume["emptyDir"] or {}).get("medium")
            if medium == "Memory" and self.tmp_dir is not None:
                own = self.tmp_dir / "shm" / name  # a tmpfs-backed /tmp is the closest, and is cleaned up
            own.mkdir(parents=True, exist_ok=True)
            identity.prepare_empty_dir(own, self.pod)
            return str(own)
        if "hostPath" in volume:
            return host_path(volume["hostPath"])
        if "persistentVolumeClaim" in volume:
            return await self._wait_for_claim(volume["persistentVolumeClaim"]["claimName"])
        for kind, resource, key in (("configMap", "configmaps", "name"), ("secret", "secrets", "secretName")):
            if kind in volume:
                source = volume[kind] or {}
                obj = await self._get_optional(resource, source.get(key, ""))
                if obj is None and not source.get("optional"):
                    raise MissingVolumeSourceError(name, kind, source.get(key, ""))
                write_files(own, obj or {}, decode=kind == "secret", items=source.get("items"))
                return str(own)
        if "projected" in volume:
            await self._write_projected(own, volume["projected"] or {})
            return str(own)
        if "downwardAPI" in volume:
            self._write_downward_api(own, (volume["downwardAPI"] or {}).get("items") or [])
            return str(own)
        raise RuntimeError(f"volume {name!r}: unsupported volume type")

    async def _write_projected(self, target: Path, projected: Mapping[str, Any]) -> None:
        """A projected volume, as ServiceAccount admission adds one to every pod (kube-api-access-*):
        a token from the TokenRequest API bound to this pod, the cluster CA from the
        ``kube-root-ca.crt`` ConfigMap, and the namespace from the downward API."""
        write_files(target, {}, decode=False, items=None)  # the volume exists even when empty
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token_source = source["serviceAccountToken"] or {}
                token = await self._request_token(token_source)
                (target / token_source.get("path", "token")).write_text(token)
            elif "configMap" in source or "secret" in source:
                kind, resource = (
                    ("configMap", "configmaps") if "configMap" in source else ("secret", "secrets")
                )
                ref = source[kind] or {}
                obj = await self._get_optional(resource, ref.get("name", ""))
                if obj is None and not ref.get("optional"):
                    raise MissingVolumeSourceError(target.name, kind, ref.get("name", ""))
                write_files(target, obj or {}, decode=kind == "secret", items=ref.get("items"))
            elif "downwardAPI" in source:
                self._write_downward_api(target, (source["downwardAPI"] or {}).get("items") or [])

    async def _request_token(self, source: Mapping[str, Any]) -> str:
        """A service-account token bound to this pod (NodeRestriction lets a node ask only for its
        own pods' accounts, and only bound to the pod)."""
        account = self.pod.get("spec", {}).get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": int(source.get("expirationSeconds") or 3607),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid},
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = path_for("serviceaccounts", self.namespace, account, "token")
        result = await with_authorization_retry(lambda: self.client.create(path, body))
        return str(result["status"]["token"])

    def _write_downward_api(self, target: Path, items: list[Mapping[str, Any]]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for item in items:
            field = (item.get("fieldRef") or {}).get("fieldPath")
            if not field:
                continue
            value = field_ref_value(field, self.pod, pod_ip=self.pod_ip, host_ip=self.host_ip)
            path = target / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)

    async def _wait_for_claim(self, claim: str) -> str:
        """The directory of the PV bound to ``claim``, waiting (ContainerCreating) until it is bound."""
        while True:
            pvc = await self._get_optional("persistentvolumeclaims", claim)
            volume_name = (pvc or {}).get("spec", {}).get("volumeName")
            if pvc is not None and volume_name and pvc.get("status", {}).get("phase") == "Bound":
                pv_path = path_for("persistentvolumes", name=volume_name)
                pv = await with_authorization_retry(functools.partial(self.client.get, pv_path))
                return str(volume_directory(pv, self.state_dir))
            self.waiting(f"waiting for PersistentVolumeClaim {claim!r} to be bound", None)
            await asyncio.sleep(0.5)
