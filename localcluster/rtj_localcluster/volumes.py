"""PersistentVolume binding and provisioning for the local cluster (the PV controller's part).

A PVC naming ``volumeName`` binds to that PV; a PVC with ``storageClassName: ""`` binds to an
Available PV of class "" whose capacity and access modes fit; a PVC of an existing StorageClass
(``local``, created at start and marked default, or any other, e.g. ``fsx.csi.aws.com``) gets a
PV ``pvc-<uid>`` whose data is a directory under ``<state>/volumes/``. Released PVs of reclaim
policy Delete are deleted with their directory. The kubelet (``volume_directory``) maps a bound PV
to its directory. ``match_static_volume`` is the pure matching rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .client import ApiError, Informer, KubeClient, path_for, run_level_triggered
from .quantity import parse_quantity

log = logging.getLogger(__name__)

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
LOCAL_PROVISIONER = "rtj.local/directory"


def default_storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": LOCAL_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def _requested(pvc: Mapping[str, Any]) -> str:
    return str((pvc.get("spec", {}).get("resources") or {}).get("requests", {}).get("storage", "0"))


def match_static_volume(
    pvc: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The smallest Available PV of the claim's class with enough capacity and the access modes."""
    spec = pvc.get("spec", {})
    wanted_class = spec.get("storageClassName") or ""
    modes = set(spec.get("accessModes") or [])
    need = parse_quantity(_requested(pvc))
    meta = pvc.get("metadata", {})
    best: tuple[Any, Mapping[str, Any]] | None = None
    for pv in volumes:
        pv_spec = pv.get("spec", {})
        claim = pv_spec.get("claimRef")
        if claim and (claim.get("name"), claim.get("namespace")) != (meta.get("name"), meta.get("namespace")):
            continue
        if (pv_spec.get("storageClassName") or "") != wanted_class:
            continue
        if pv.get("status", {}).get("phase") not in (None, "", "Available") and not claim:
            continue
        if not modes <= set(pv_spec.get("accessModes") or []):
            continue
        size = parse_quantity(str((pv_spec.get("capacity") or {}).get("storage", "0")))
        if size < need:
            continue
        if best is None or size < best[0]:
            best = (size, pv)
    return best[1] if best else None


class VolumeBinder:
    def __init__(
        self, client: KubeClient, claims: Informer, volumes: Informer, classes: Informer, state_dir: Path
    ) -> None:
        self._client = client
        self._claims = claims
        self._volumes = volumes
        self._classes = classes
        self._state_dir = state_dir
        self._wake = asyncio.Event()
        for informer in (claims, volumes, classes):
            informer.subscribe(self._wake.set)

    async def run(self) -> None:
        await run_level_triggered(
            "volume binding",
            (self._claims, self._volumes, self._classes),
            self._wake,
            self.sync,
            period_seconds=5,
        )

    def _default_class(self) -> str | None:
        for item in self._classes.items():
            if (item["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true":
                return str(item["metadata"]["name"])
        return None

    async def sync(self) -> None:
        for pvc in self._claims.items():
            if pvc.get("status", {}).get("phase") == "Bound" or pvc["metadata"].get("deletionTimestamp"):
                continue
            await self._bind_claim(pvc)
        await self._release_volumes()

    async def _bind_claim(self, pvc: Mapping[str, Any]) -> None:
        spec = pvc.get("spec", {})
        pv: Mapping[str, Any] | None = None
        if spec.get("volumeName"):
            pv = self._volumes.get(spec["volumeName"])
            if pv is None:
                return  # the named PV may still be coming
        else:
            class_name = spec.get("storageClassName")
            if class_name is None:
                class_name = self._default_class()
            if class_name == "" or class_name is None:
                pv = match_static_volume(pvc, self._volumes.items())
            else:
                pv = match_static_volume(pvc, self._volumes.items()) or await self._provision(pvc, class_name)
        if pv is None:
            return
        await self._bind(pvc, pv)

    async def _provision(self, pvc: Mapping[str, Any], class_name: str) -> Mapping[str, Any] | None:
        storage_class = self._classes.get(class_name)
        if storage_class is None:
            return None
        meta = pvc["metadata"]
        name = f"pvc-{meta['uid']}"
        directory = self._state_dir / "volumes" / name
        directory.mkdir(parents=True, exist_ok=True)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": {"pv.kubernetes.io/provisioned-by": storage_class.get("provisioner", "")},
            },
            "spec": {
                "capacity": {"storage": _requested(pvc)},
                "accessModes": list(pvc.get("spec", {}).get("accessModes") or ["ReadWriteOnce"]),
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
                "storageClassName": class_name,
                "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            created: dict[str, Any] = await self._client.create(path_for("persistentvolumes"), pv)
            return created
        except ApiError as error:
            if error.status == 409:
                return self._volumes.get(name)
            raise

    async def _bind(self, pvc: Mapping[str, Any], pv: Mapping[str, Any]) -> None:
        meta = pvc["metadata"]
        pv_name = pv["metadata"]["name"]
        claim_ref = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
        await self._client.patch(
            path_for("persistentvolumes", name=pv_name), {"spec": {"claimRef": claim_ref}}
        )
        await self._client.patch(
            path_for("persistentvolumes", name=pv_name, subresource="status"), {"status": {"phase": "Bound"}}
        )
        pvc_path = path_for("persistentvolumeclaims", meta["namespace"], meta["name"])
        await self._client.patch(
            pvc_path,
            {
                "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
                "spec": {"volumeName": pv_name},
            },
        )
        pv_spec = pv.get("spec", {})
        await self._client.patch(
            pvc_path + "/status",
            {
                "status": {
                    "phase": "Bound",
                    "capacity": dict(pv_spec.get("capacity") or {}),
                    "accessModes": list(pv_spec.get("accessModes") or []),
                }
            },
        )

    async def _release_volumes(self) -> None:
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in self._claims.items()}
        for pv in self._volumes.items():
            spec = pv.get("spec", {})
            name = pv["metadata"]["name"]
            claim = spec.get("claimRef")
            phase = pv.get("status", {}).get("phase")
            if not claim:
                if phase != "Available":
                    await self._set_phase(name, "Available")
                continue
            current = claims.get((claim.get("namespace"), claim.get("name")))
            if current is not None and (
                not claim.get("uid") or current["metadata"].get("uid") == claim.get("uid")
            ):
                continue
            if not claim.get("uid"):
                continue  # pre-bound to a claim that does not exist yet
            if spec.get("persistentVolumeReclaimPolicy") == "Delete":
                with contextlib.suppress(ApiError):
                    await self._client.delete(path_for("persistentvolumes", name=name))
                directory = self._state_dir / "volumes" / name
                if directory.is_dir():
                    shutil.rmtree(directory, ignore_errors=True)
            elif phase != "Released":
                await self._set_phase(name, "Released")

    async def _set_phase(self, name: str, phase: str) -> None:
        with contextlib.suppress(ApiError):
            await self._client.patch(
                path_for("persistentvolumes", name=name, subresource="status"), {"status": {"phase": phase}}
            )
