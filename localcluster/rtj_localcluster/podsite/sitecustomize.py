"""Cluster DNS inside a local-cluster pod: Python's resolver answers Service names from a hosts file.

The process kubelet puts this directory first on the pod's ``PYTHONPATH``; Python imports
``sitecustomize`` at start-up. ``socket.getaddrinfo``, ``gethostbyname`` and ``gethostbyname_ex``
are wrapped: a name found in the file named by ``RTJ_LOCAL_HOSTS_FILE`` (written by
``rtj_localcluster.dns``; re-read when its mtime changes) is answered from it, trying the pod's DNS
search domains (``<ns>.svc.cluster.local``, ``svc.cluster.local``, ``cluster.local``) for short
names as resolv.conf would; any other name falls through to the real resolver. A
``sitecustomize`` later on the path (for example the environment's own) is still imported.

The service-account files sit in a directory of the pod, not at the constant path in-cluster
clients read: when the official ``kubernetes`` client's ``incluster_config`` module is imported, its
two path constants are pointed at ``RTJ_SERVICE_ACCOUNT_DIR`` (so an operator pod finds its token).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import socket
import sys
from typing import Any

_real_getaddrinfo = socket.getaddrinfo
_real_gethostbyname = socket.gethostbyname
_real_gethostbyname_ex = socket.gethostbyname_ex
_cache: dict[str, Any] = {"mtime": None, "records": {}}


def _records() -> dict[str, list[str]]:
    path = os.environ.get("RTJ_LOCAL_HOSTS_FILE")
    if not path:
        return {}
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return {}
    if mtime != _cache["mtime"]:
        records: dict[str, list[str]] = {}
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    parts = line.split("#", 1)[0].split()
                    for name in parts[1:]:
                        records.setdefault(name.lower(), []).append(parts[0])
        except OSError:
            return {}
        _cache.update(mtime=mtime, records=records)
    result: dict[str, list[str]] = _cache["records"]
    return result


def lookup(host: object) -> list[str] | None:
    """The addresses the hosts file gives ``host`` (with search domains), or None."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "ignore")
    if not isinstance(host, str) or not host:
        return None
    name = host.lower().rstrip(".")
    records = _records()
    if not records:
        return None
    candidates = [name]
    if not host.endswith(".") and name.count(".") < 5:
        namespace = os.environ.get("RTJ_LOCAL_POD_NAMESPACE", "default")
        candidates += [
            f"{name}.{namespace}.svc.cluster.local",
            f"{name}.svc.cluster.local",
            f"{name}.cluster.local",
        ]
    for candidate in candidates:
        if candidate in records:
            return records[candidate]
    return None


def _getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0) -> Any:  # noqa: A002, PLR0917
    addresses = lookup(host)
    if addresses is None or family not in (0, socket.AF_INET):
        return _real_getaddrinfo(host, port, family, type, proto, flags)
    if isinstance(port, bytes):
        port = port.decode()
    if port is None:
        number = 0
    elif isinstance(port, int):
        number = port
    elif port.isdigit():
        number = int(port)
    else:
        number = socket.getservbyname(port)
    kinds = (
        [(type, proto)]
        if type
        else [
            (socket.SOCK_STREAM, socket.IPPROTO_TCP),
            (socket.SOCK_DGRAM, socket.IPPROTO_UDP),
            (socket.SOCK_RAW, 0),
        ]
    )
    return [
        (socket.AF_INET, kind, kind_proto or proto, "", (address, number))
        for address in addresses
        for kind, kind_proto in kinds
    ]


def _gethostbyname(host: str) -> str:
    addresses = lookup(host)
    return addresses[0] if addresses else _real_gethostbyname(host)


def _gethostbyname_ex(host: str) -> tuple[str, list[str], list[str]]:
    addresses = lookup(host)
    if addresses:
        return host, [], list(addresses)
    return _real_gethostbyname_ex(host)


socket.getaddrinfo = _getaddrinfo
socket.gethostbyname = _gethostbyname
socket.gethostbyname_ex = _gethostbyname_ex


_INCLUSTER_MODULE = "kubernetes.config.incluster_config"


class _InClusterPaths(importlib.abc.MetaPathFinder):
    """Sets the in-cluster client's token and CA paths right after its module runs."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _INCLUSTER_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            directory = os.environ.get("RTJ_SERVICE_ACCOUNT_DIR", "")
            module.SERVICE_TOKEN_FILENAME = os.path.join(directory, "token")
            module.SERVICE_CERT_FILENAME = os.path.join(directory, "ca.crt")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("RTJ_SERVICE_ACCOUNT_DIR"):
    sys.meta_path.insert(0, _InClusterPaths())


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_rtj_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


_chain_next_sitecustomize()
