"""Cluster DNS for the local cluster: a hosts file kept current from Pods and Services.

``hosts_records`` (pure) maps names to pod IPs the way CoreDNS's kubernetes plugin does for the
records the project needs: ``<svc>.<ns>.svc[.cluster.local]`` -> the IPs of the Service's endpoints
(pods matching its selector, Ready ones only unless ``publishNotReadyAddresses``), and for pods
with ``hostname`` + ``subdomain`` naming a headless Service ``<hostname>.<subdomain>.<ns>.svc
[.cluster.local]``. ``HostsFileWriter`` rewrites the file atomically when the records change; the
``sitecustomize`` module in ``podsite/`` reads it inside every pod (``RTJ_LOCAL_HOSTS_FILE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .client import Informer

CLUSTER_DOMAIN = "cluster.local"


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    for item in pod.get("status", {}).get("conditions") or []:
        if item.get("type") == "Ready":
            return bool(item.get("status") == "True")
    return False


def _selects(selector: Mapping[str, str], pod: Mapping[str, Any]) -> bool:
    labels = pod.get("metadata", {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _names(base: str) -> list[str]:
    return [base, f"{base}.{CLUSTER_DOMAIN}"]


def hosts_records(
    pods: Iterable[Mapping[str, Any]], services: Iterable[Mapping[str, Any]]
) -> dict[str, list[str]]:
    """name -> sorted IPs, for the current pods (with an IP, not terminated) and services."""
    live = [
        p
        for p in pods
        if p.get("status", {}).get("podIP")
        and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        and not p.get("metadata", {}).get("deletionTimestamp")
    ]
    records: dict[str, set[str]] = {}
    for service in services:
        meta = service.get("metadata", {})
        namespace, name = meta.get("namespace"), meta.get("name")
        spec = service.get("spec", {})
        publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
        selector = spec.get("selector") or {}
        for pod in live:
            pod_meta = pod.get("metadata", {})
            if pod_meta.get("namespace") != namespace or not _selects(selector, pod):
                continue
            if not publish_not_ready and not _pod_ready(pod):
                continue
            ip = pod["status"]["podIP"]
            for record in _names(f"{name}.{namespace}.svc"):
                records.setdefault(record, set()).add(ip)
            pod_spec = pod.get("spec", {})
            if (
                spec.get("clusterIP") == "None"
                and pod_spec.get("hostname")
                and pod_spec.get("subdomain") == name
            ):
                for record in _names(f"{pod_spec['hostname']}.{name}.{namespace}.svc"):
                    records.setdefault(record, set()).add(ip)
    return {name: sorted(ips) for name, ips in sorted(records.items())}


def render_hosts(records: Mapping[str, list[str]]) -> str:
    lines = ["# Written by the rtj local cluster; one line per (address, name)."]
    for name, ips in records.items():
        lines.extend(f"{ip} {name}" for ip in ips)
    return "\n".join(lines) + "\n"


class HostsFileWriter:
    """Rewrites the hosts file whenever Pods or Services change what it should say."""

    def __init__(self, path: Path, pods: Informer, services: Informer) -> None:
        self.path = path
        self._pods = pods
        self._services = services
        self._wake = asyncio.Event()
        pods.subscribe(self._wake.set)
        services.subscribe(self._wake.set)
        self._written: str | None = None

    def write(self) -> None:
        content = render_hosts(hosts_records(self._pods.items(), self._services.items()))
        if content == self._written:
            return
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(content)
        os.replace(temporary, self.path)
        self._written = content

    async def run(self) -> None:
        self.write()
        await self._pods.synced()
        await self._services.synced()
        while True:
            self._wake.clear()
            self.write()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=5)
