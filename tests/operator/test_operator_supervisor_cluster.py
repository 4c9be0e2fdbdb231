"""A Supervisor job on the local cluster: the real API server accepts its store pod, the scheduler puts
the store on a node of its own, the workers reach it by its DNS name, and losing worker 0's node
replaces worker 0 alone (no gang restart: the store is not on it).

The workers run a small stand-in for rtj-launch's supervisor mode (no torch): each connects to
RTJ_STORE_HOST:RTJ_STORE_PORT, retrying while the DNS record appears, and fails if it cannot (a
failed worker would restart the gang, which the test rules out); then it holds its node. The store
pod's `rtj-store` is a stand-in too, put on the pods' PATH behind the environment's own programs: it
serves the store's two ports and nothing else.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_cluster import (
    apply,
    event_lines,
    event_reasons,
    install_crd,
    job_manifest,
    job_status,
    pods,
    wait_state,
)
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port_pair
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator import constants, events, names
from rtj_operator.main import EmbeddedOperator
from rtj_operator.runtime import job_pass

pytestmark = pytest.mark.slow

JOB = "world"
WORKER_STAND_IN = """
import os, socket, sys, time
host, port = os.environ["RTJ_STORE_HOST"], int(os.environ["RTJ_STORE_PORT"])
deadline = time.monotonic() + 120
while True:
    try:
        socket.create_connection((host, port), timeout=5).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(2)
        time.sleep(0.5)
print(f"reached the store at {host}:{port}", flush=True)
time.sleep(600)
"""
STORE_STAND_IN = """import socket, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
servers = [socket.create_server(("", p)) for p in (port, port + 1)]
time.sleep(3600)
"""


def logged(kubeconfig: Path, pod: str, line: str) -> bool:
    return line in kubectl(kubeconfig, "-n", "default", "logs", pod)


def addresses(hosts_file: Path, name: str) -> list[str]:
    """The addresses the cluster's DNS (a hosts file every pod reads) gives `name`."""
    lines = [line.split() for line in hosts_file.read_text().splitlines() if not line.startswith("#")]
    return [fields[0] for fields in lines if name in fields[1:]]


@pytest.fixture
def store_program(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An `rtj-store` stand-in on the pods' PATH (the kubelet gives containers the host's PATH behind
    the environment's bin directory), readable by the trainer's user the pods run as."""
    directory = Path(tempfile.mkdtemp(prefix="rtj-store-"))
    directory.chmod(0o755)
    program = directory / "rtj-store"
    program.write_text(f"#!{sys.executable}\n{STORE_STAND_IN}")
    program.chmod(0o755 | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', os.defpath)}")
    yield program
    program.unlink()
    directory.rmdir()


@pytest.mark.local_cluster(nodes=4, profile="cpu", node_monitor_grace_seconds=3.0)
def test_a_supervisor_job_keeps_its_store_apart_and_loses_worker_zeros_node_without_a_gang_restart(
    local_cluster: LocalCluster, tmp_path: Path, store_program: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    caplog.set_level(logging.INFO, logger=job_pass.logger.name)  # the operator's decisions, if it fails
    store = names.store_pod_name(JOB)
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = job_manifest(
            JOB,
            "default",
            nodes=2,
            command=["python", "-c", WORKER_STAND_IN],
            rendezvous={"port": reserve_port_pair()},
            faultTolerance={"launcher": "Supervisor"},
        )
        apply(kc, job, tmp_path)
        running = wait_state(kc, "default", JOB, "Running", timeout=180)
        assert running["store"]["state"] == "Running"
        children = pods(kc, "default", JOB)
        assert set(children) == {store, f"{JOB}-worker-0", f"{JOB}-worker-1"}
        store_pod = children[store]
        assert store_pod["metadata"]["labels"][constants.LABEL_ROLE] == constants.ROLE_STORE
        nodes = {name: pod["spec"]["nodeName"] for name, pod in children.items()}
        # The store never shares a node with a worker (required pod anti-affinity, both ways).
        assert len(set(nodes.values())) == 3, nodes
        # Its DNS name resolves to it, as the workers found (they would have failed otherwise).
        record = f"{store}.{JOB}.default.svc"
        assert addresses(local_cluster.hosts_file, record) == [store_pod["status"]["podIP"]]
        for worker in (f"{JOB}-worker-0", f"{JOB}-worker-1"):
            wait_for(
                functools.partial(logged, kc, worker, f"reached the store at {record}:"),
                timeout=120,
                message=f"{worker} to reach the store pod by its DNS name",
            )
        before = {name: pod["metadata"]["uid"] for name, pod in children.items()}
        lost = nodes[f"{JOB}-worker-0"]
        local_cluster.kill_node(lost)

        def replaced() -> dict[str, dict[str, Any]] | None:
            now = pods(kc, "default", JOB)
            new = now.get(f"{JOB}-worker-0")
            if new is None or new["metadata"]["uid"] == before[f"{JOB}-worker-0"]:
                return None
            return now if new.get("status", {}).get("phase") == "Running" else None

        after = wait_for(replaced, timeout=180, message="worker 0 replaced and running")
        status = wait_state(kc, "default", JOB, "Running", timeout=120)
        assert after[f"{JOB}-worker-0"]["spec"]["nodeName"] not in {
            lost,
            nodes[store],
            nodes[f"{JOB}-worker-1"],
        }
        for name in (store, f"{JOB}-worker-1"):
            assert after[name]["metadata"]["uid"] == before[name], name
        decisions = "\n".join(r.getMessage() for r in caplog.records if r.name == job_pass.logger.name)
        assert status["restarts"]["podReplacement"] == 1, event_lines(kc, "default", JOB) + "\n" + decisions
        assert [f["nodeName"] for f in status["nodeFaults"]] == [lost]
        reasons = event_reasons(kc, "default", JOB)
        assert events.NODE_LOST in reasons and events.WORKER_REPLACED in reasons
        assert events.GANG_RESTART not in reasons and events.STORE_LOST not in reasons
        assert job_status(kc, "default", JOB)["store"]["podName"] == store
