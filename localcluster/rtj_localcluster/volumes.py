"""A volume provisioner for the local cluster: directories on this machine stand in for storage.

Binding is Kubernetes' own: the controller manager's PV controller binds static PVs (a claim naming
``volumeName``, or a PV's ``claimRef``) and, for a claim whose StorageClass names a provisioner that
is not built in, marks it with ``volume.kubernetes.io/storage-provisioner`` and waits for that
provisioner, as it waits for a CSI driver's external-provisioner on EKS. ``Provisioner`` plays that
part for every such class (the default class ``local``, created at start, and any other, e.g.
``fsx.csi.aws.com``): it creates a PV ``pvc-<uid>`` pre-bound to the claim, with its data in a
directory under ``<state>/volumes/``; the PV controller then binds the two. A released PV it
provisioned with reclaim policy Delete is deleted with its directory. The kubelet
(``pod_volumes.volume_directory``) maps a bound PV of any kind to its directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .client import ApiError, Informer, KubeClient, path_for, run_level_triggered

log = logging.getLogger(__name__)

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
LOCAL_PROVISIONER = "rtj.local/directory"
PROVISIONER_ANNOTATIONS = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
IN_TREE_PREFIX = "kubernetes.io/"


def default_storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": LOCAL_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def requested_provisioner(pvc: Mapping[str, Any]) -> str | None:
    """The provisioner the PV controller asked to serve ``pvc``, if it waits for one we serve."""
    if pvc.get("spec", {}).get("volumeName") or pvc.get("metadata", {}).get("deletionTimestamp"):
        return None
    annotations = pvc.get("metadata", {}).get("annotations") or {}
    for key in PROVISIONER_ANNOTATIONS:
        name = annotations.get(key)
        if name and not str(name).startswith(IN_TREE_PREFIX):
            return str(name)
    return None


def provisioned_volume(
    pvc: Mapping[str, Any], storage_class: Mapping[str, Any], directory: Path
) -> dict[str, Any]:
    """The PV that serves ``pvc``: its size and access modes, the class's reclaim policy, pre-bound."""
    meta = pvc["metadata"]
    spec = pvc.get("spec", {})
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{meta['uid']}",
            "annotations": {PROVISIONED_BY: str(storage_class.get("provisioner", ""))},
        },
        "spec": {
            "capacity": {
                "storage": str(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
            },
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
            "storageClassName": storage_class["metadata"]["name"],
            "volumeMode": spec.get("volumeMode") or "Filesystem",
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


class Provisioner:
    """Creates PVs for claims waiting on a provisioner, deletes released ones it made."""

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
            "volume provisioning",
            (self._claims, self._volumes, self._classes),
            self._wake,
            self.sync,
            period_seconds=5,
            error_delay_seconds=1,
        )

    async def sync(self) -> None:
        for pvc in self._claims.items():
            if requested_provisioner(pvc) is not None:
                await self._provision(pvc)
        await self._delete_released()

    async def _provision(self, pvc: Mapping[str, Any]) -> None:
        class_name = pvc.get("spec", {}).get("storageClassName")
        storage_class = self._classes.get(str(class_name)) if class_name else None
        if storage_class is None or self._volumes.get(f"pvc-{pvc['metadata']['uid']}") is not None:
            return
        directory = self._state_dir / "volumes" / f"pvc-{pvc['metadata']['uid']}"
        directory.mkdir(parents=True, exist_ok=True)
        try:
            await self._client.create(
                path_for("persistentvolumes"), provisioned_volume(pvc, storage_class, directory)
            )
        except ApiError as error:
            if error.status != 409:
                raise

    async def _delete_released(self) -> None:
        for pv in self._volumes.items():
            meta, spec = pv["metadata"], pv.get("spec", {})
            ours = str((meta.get("annotations") or {}).get(PROVISIONED_BY, ""))
            if not ours or ours.startswith(IN_TREE_PREFIX) or meta.get("deletionTimestamp"):
                continue
            if pv.get("status", {}).get("phase") != "Released":
                continue
            if spec.get("persistentVolumeReclaimPolicy") != "Delete":
                continue
            with contextlib.suppress(ApiError):
                await self._client.delete(path_for("persistentvolumes", name=meta["name"]))
            directory = self._state_dir / "volumes" / meta["name"]
            if directory.is_dir():
                shutil.rmtree(directory, ignore_errors=True)
