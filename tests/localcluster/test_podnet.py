"""The pod network library and the pod IP blocks on their own, without a cluster: processes that
carry the library and a pod IP bind that IP for the wildcard, and allocators never share a block."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rtj_localcluster import podnet
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import require_podnet

# Binds the wildcard (argv[2]: "0.0.0.0", a dual-stack "::" or an IPv6-only "::") on port argv[1],
# connects to it through 127.0.0.1, and prints what it got.
PROBE = """
import socket, sys
port, how = int(sys.argv[1]), sys.argv[2]
if how == "0.0.0.0":
    server = socket.create_server(("0.0.0.0", port))
else:
    server = socket.socket(socket.AF_INET6)
    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(how == "v6only"))
    try:
        server.bind(("::", port))
    except OSError as error:
        print("error", error.errno)
        sys.exit(0)
    server.listen()
with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
    print(server.getsockname()[0], conn.getpeername()[0])
"""


@pytest.fixture(scope="module")
def library() -> Path:
    return require_podnet()


def probe(library: Path, pod_ip: str, port: int, how: str) -> list[str]:
    env = {**os.environ, "LD_PRELOAD": str(library), podnet.POD_IP_ENV: pod_ip}
    command = [sys.executable, "-c", PROBE, str(port), how]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_the_wildcard_is_the_pod_ip_and_localhost_reaches_it(library: Path) -> None:
    port = reserve_port()
    # The port is held on 127.0.0.1 meanwhile: the pods' binds do not touch it.
    with socket.create_server(("127.0.0.1", port)):
        assert probe(library, "127.0.250.1", port, "0.0.0.0") == ["127.0.250.1", "127.0.250.1"]
        assert probe(library, "127.0.250.2", port, "dualstack") == ["::ffff:127.0.250.2", "127.0.250.2"]
        assert probe(library, "127.0.250.3", port, "v6only") == ["error", "99"]  # EADDRNOTAVAIL


def test_container_env_puts_the_library_first(library: Path) -> None:
    env = {"LD_PRELOAD": "/other.so"}
    podnet.container_env(env, "127.0.3.4")
    assert env["LD_PRELOAD"] == f"{library} /other.so"
    assert env[podnet.POD_IP_ENV] == "127.0.3.4"


def test_allocators_hold_distinct_blocks(tmp_path: Path) -> None:
    first, second = podnet.IpAllocator(tmp_path), podnet.IpAllocator(tmp_path)
    a, b = first.allocate(), second.allocate()
    assert a.startswith("127.") and a.endswith(".1.1")
    assert a.split(".")[1] != b.split(".")[1]
    assert first.allocate() == f"127.{first.block}.1.2"
    block = first.block
    first.release()
    third = podnet.IpAllocator(tmp_path)
    assert third.allocate() == f"127.{block}.1.1"  # a released block is free again
    second.release()
    third.release()


def test_taken_ports_skips_listeners_of_the_same_owner() -> None:
    port = reserve_port()
    env = {**os.environ, podnet.OWNER_ENV: "job-uid"}
    script = (
        f"import socket, time\ns = socket.create_server(('0.0.0.0', {port}))\n"
        "print('up', flush=True)\ntime.sleep(60)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
            container = {"ports": [{"containerPort": port}, {"containerPort": port, "protocol": "UDP"}]}
            assert podnet.taken_ports(container, "job-uid") == []  # worker 0 of the same job holds it
            assert podnet.taken_ports(container, "other-uid") == [port]
        finally:
            holder.kill()
    assert podnet.taken_ports({"ports": [{"containerPort": port}]}, "other-uid") == []
