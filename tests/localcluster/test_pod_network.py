"""Pods listen on the same port without colliding: each pod's wildcard address is its own pod IP
(the LD_PRELOAD library of ``rtj_localcluster.podnet``), in one local cluster and across two.

Runs against the embedded cluster (pods are processes of this machine); skips against a real one.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import pytest
from rtj_localcluster import kubelet as kubelet_module
from rtj_localcluster import podnet
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import create_namespace, require_podnet, wait_for

pytestmark = pytest.mark.slow

# Listens on the wildcard of argv[2] ("0.0.0.0" or a dual-stack "::"), checks that "localhost" in the
# pod reaches its own server and that the API server on 127.0.0.1 is still reachable, then answers
# every connection with its pod IP.
SERVER = """
import os, socket, sys
port, wildcard = int(sys.argv[1]), sys.argv[2]
if wildcard == "::":
    server = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
else:
    server = socket.create_server(("0.0.0.0", port))
print("listening on", server.getsockname(), flush=True)
socket.create_connection(("127.0.0.1", port), timeout=5).close()
socket.create_connection((os.environ["KUBERNETES_SERVICE_HOST"], int(os.environ["KUBERNETES_SERVICE_PORT"])),
                         timeout=5).close()
print("localhost and the API server reachable", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(os.environ["POD_IP"].encode())
    conn.close()
"""

STORE = """
import datetime, os, sys
from torch.distributed import TCPStore
store = TCPStore("localhost", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                 timeout=datetime.timedelta(seconds=30))
store.set("pod", os.environ["POD_IP"])
print("store up", flush=True)
import time
while True:
    time.sleep(1)
"""


def pod(name: str, script: str, *args: str, ports: tuple[int, ...] = ()) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", script, *args],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def running_ip(api: SyncKubeClient, namespace: str, name: str) -> str:
    def check() -> str | None:
        obj = api.get_or_none(path_for("pods", namespace, name)) or {}
        status = obj.get("status", {})
        if status.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} ended: {status}")
        statuses = status.get("containerStatuses") or [{}]
        return status.get("podIP") if "running" in statuses[0].get("state", {}) else None

    ip: str = wait_for(check, timeout=90, message=f"pod {name} running")
    return ip


def answer(ip: str, port: int) -> str:
    def attempt() -> str | None:
        try:
            with socket.create_connection((ip, port), timeout=5) as conn:
                return conn.recv(100).decode()
        except OSError:
            return None

    text: str = wait_for(attempt, timeout=60, message=f"an answer from {ip}:{port}")
    return text


def test_two_pods_listen_on_the_same_port_of_all_addresses(api: SyncKubeClient, namespace: str) -> None:
    require_podnet()
    port = reserve_port()
    api.create(path_for("pods", namespace), pod("ipv4", SERVER, str(port), "0.0.0.0"))
    api.create(path_for("pods", namespace), pod("dualstack", SERVER, str(port), "::"))
    ips = {name: running_ip(api, namespace, name) for name in ("ipv4", "dualstack")}
    assert ips["ipv4"] != ips["dualstack"]
    for ip in ips.values():
        assert answer(ip, port) == ip


def test_two_local_clusters_pods_on_the_same_port(
    shared_local_cluster: LocalCluster, local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    require_podnet()
    port = reserve_port()
    api.create(path_for("pods", namespace), pod("first", SERVER, str(port), "0.0.0.0"))
    other_ns = create_namespace(local_cluster.kubeconfig_path, "net")
    with SyncKubeClient(local_cluster.kubeconfig_path) as other:
        other.create(path_for("pods", other_ns), pod("second", SERVER, str(port), "0.0.0.0"))
        first, second = running_ip(api, namespace, "first"), running_ip(other, other_ns, "second")
    assert first.split(".")[1] != second.split(".")[1], "each cluster hands out its own block of 127.b.x.y"
    assert answer(first, port) == first
    assert answer(second, port) == second


def test_two_torch_stores_on_the_same_port(api: SyncKubeClient, namespace: str) -> None:
    from torch.distributed import TCPStore

    require_podnet()
    port = reserve_port()
    for name in ("store-a", "store-b"):
        api.create(path_for("pods", namespace), pod(name, STORE, str(port)))
    for name in ("store-a", "store-b"):
        ip = running_ip(api, namespace, name)

        def value(ip: str = ip) -> bytes | None:
            try:
                client = TCPStore(ip, port, is_master=False, timeout=datetime.timedelta(seconds=5))
                result: bytes = client.get("pod")
                return result
            except RuntimeError:
                return None

        assert wait_for(value, timeout=90, message=f"the store of {name}") == ip.encode()


def test_without_the_library_a_taken_container_port_waits_with_a_reason(
    api: SyncKubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubelet_module, "library", lambda: podnet.PodNet(None, "no C compiler (test)"))
    monkeypatch.setattr(kubelet_module, "container_env", lambda env, pod_ip: None)
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        api.create(path_for("pods", namespace), pod("late", SERVER, str(port), "0.0.0.0", ports=(port,)))

        def waiting() -> dict[str, Any] | None:
            obj = api.get_or_none(path_for("pods", namespace, "late")) or {}
            statuses = obj.get("status", {}).get("containerStatuses") or [{}]
            state: dict[str, Any] = statuses[0].get("state", {}).get("waiting") or {}
            return state if state.get("reason") == "PortInUse" else None

        state = wait_for(waiting, timeout=60, message="container waiting with reason PortInUse")
        assert str(port) in state["message"] and "no C compiler (test)" in state["message"]
    finally:
        holder.close()
    ip = running_ip(api, namespace, "late")
    assert answer(ip, port) == ip
