"""The process kubelet end to end: real processes for pods, volumes, env, DNS, status, logs.

Runs against the embedded cluster (the image is ignored and commands run on this machine), so the
tests use the session's shared local cluster and skip against a real one.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import kubectl, process_ended, wait_for, wait_phase

pytestmark = pytest.mark.slow


def pod_manifest(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "python:3.11", "command": ["python", "-c", script]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def get_pod(api: SyncKubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    result: dict[str, Any] | None = api.get_or_none(path_for("pods", namespace, name))
    return result


ZONE_FIELD = "metadata.labels['topology.kubernetes.io/zone']"
PEER = "import time\nwhile True: time.sleep(1)"

MAIN = """
import json, os, socket, sys
target = sys.argv[1]
with open(target, "w") as handle:
    handle.write(os.environ["POD_NAME"] + " on " + os.environ["NODE_NAME"])
print(json.dumps({
    "target": target,
    "pod": os.environ["POD_NAME"],
    "node": os.environ["NODE_NAME"],
    "ip": os.environ["POD_IP"],
    "zone": os.environ["ZONE"],
    "peer": socket.gethostbyname("peer-0.peers.%s.svc" % os.environ["NS"]),
    "peer_short": socket.gethostbyname("peer-0.peers"),
    "cwd": os.getcwd(),
    "tmp": os.environ["TMPDIR"],
    "token": open(os.environ["SA"] + "/token").read() != "",
    "sa_dirs": [os.environ["SA"], os.environ["RTJ_SERVICE_ACCOUNT_DIR"]],
    "api": os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"],
}))
"""


def test_pod_runs_as_a_process_with_volume_env_dns_and_logs(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    cluster = shared_local_cluster
    api.create(
        path_for("persistentvolumeclaims", namespace),
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    api.create(
        path_for("services", namespace),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "peer"},
                "ports": [{"port": 29500}],
            },
        },
    )
    api.create(
        path_for("pods", namespace),
        pod_manifest("peer-0", PEER, hostname="peer-0", subdomain="peers", labels={"app": "peer"}),
    )
    peer = wait_phase(api, namespace, "peer-0", "Running")
    field = {"fieldRef": {"fieldPath": "metadata.name"}}
    main = pod_manifest(
        "main",
        MAIN,
        container={
            "args": ["/data/out.txt"],
            "workingDir": "/data",
            "env": [
                {"name": "POD_NAME", "valueFrom": field},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                # The API server copies the node's zone label onto the pod at binding (1.35 on).
                {"name": "ZONE", "valueFrom": {"fieldRef": {"fieldPath": ZONE_FIELD}}},
                {"name": "SA", "value": "/var/run/secrets/kubernetes.io/serviceaccount"},
            ],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    )
    api.create(path_for("pods", namespace), main)
    pod = wait_phase(api, namespace, "main", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert terminated["reason"] == "Completed"

    node = api.get(path_for("nodes", name=pod["spec"]["nodeName"]))
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert (
        pod["metadata"]["labels"]["topology.kubernetes.io/zone"]
        == node["metadata"]["labels"]["topology.kubernetes.io/zone"]
    )

    logs = kubectl(cluster.kubeconfig_path, "logs", "-n", namespace, "main")
    report = json.loads(logs.strip().splitlines()[-1])
    pvc = api.get(path_for("persistentvolumeclaims", namespace, "data"))
    assert pvc["status"]["phase"] == "Bound"
    pv = api.get(path_for("persistentvolumes", name=pvc["spec"]["volumeName"]))
    volume_dir = Path(pv["spec"]["hostPath"]["path"])
    assert report["target"] == str(volume_dir / "out.txt")  # /data/out.txt rewritten
    assert Path(report["cwd"]) == volume_dir  # workingDir rewritten
    assert (volume_dir / "out.txt").read_text() == f"main on {pod['spec']['nodeName']}"
    assert report["pod"] == "main"
    assert report["ip"] == pod["status"]["podIP"]
    assert report["zone"] == node["metadata"]["labels"]["topology.kubernetes.io/zone"] != ""
    assert ipaddress.ip_address(report["ip"]).is_loopback
    assert report["peer"] == report["peer_short"] == peer["status"]["podIP"] != report["ip"]
    assert report["token"] is True
    assert report["sa_dirs"][0] == report["sa_dirs"][1] != "/var/run/secrets/kubernetes.io/serviceaccount"
    assert report["api"] == cluster.url.removeprefix("https://")
    assert len(report["tmp"]) < 40  # short enough for Unix socket paths below it


def test_failed_exit_code_restart_policy_and_previous_logs(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    kubeconfig_path = shared_local_cluster.kubeconfig_path
    api.create(path_for("pods", namespace), pod_manifest("fails", "import sys; print('bye'); sys.exit(3)"))
    flaky = (
        "import os, sys\n"
        "marker = sys.argv[1]\n"
        "first = not os.path.exists(marker)\n"
        "open(marker, 'w').close()\n"
        "print('first run' if first else 'second run')\n"
        "sys.exit(1 if first else 0)"
    )
    api.create(
        path_for("pods", namespace),
        pod_manifest(
            "flaky",
            flaky,
            restartPolicy="OnFailure",
            container={
                "args": ["/scratch/ran-once"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            },
            volumes=[{"name": "scratch", "emptyDir": {}}],
        ),
    )
    failed = wait_phase(api, namespace, "fails", "Failed", "Succeeded")
    assert failed["status"]["phase"] == "Failed"
    state = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (3, "Error")

    flaky_pod = wait_phase(api, namespace, "flaky", "Succeeded", "Failed")
    assert flaky_pod["status"]["phase"] == "Succeeded"
    status = flaky_pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert kubectl(kubeconfig_path, "logs", "-n", namespace, "flaky").strip() == "second run"
    assert kubectl(kubeconfig_path, "logs", "--previous", "-n", namespace, "flaky").strip() == "first run"


def test_delete_sends_sigterm_then_finishes_the_delete(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    script = (
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    print('got SIGTERM', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.2)"
    )
    api.create(
        path_for("pods", namespace), pod_manifest("graceful", script, terminationGracePeriodSeconds=30)
    )
    pod = wait_phase(api, namespace, "graceful", "Running")
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))
    assert psutil.pid_exists(pid)
    pod_dir = shared_local_cluster.pod_dir(namespace, "graceful")
    assert pod_dir is not None
    wait_for(lambda: "ready" in (pod_dir / "main.log").read_text(), message="the process to start")
    api.delete(path_for("pods", namespace, "graceful"))
    wait_for(lambda: get_pod(api, namespace, "graceful") is None, timeout=60, message="the pod to be gone")
    assert "got SIGTERM" in (pod_dir / "main.log").read_text()

    def reasons() -> set[str]:
        events = api.get(path_for("events", namespace))["items"]
        return {e["reason"] for e in events if e["involvedObject"]["name"] == "graceful"}

    wait_for(lambda: {"Scheduled", "Started", "Killing"} <= reasons(), timeout=30, message="the pod's events")
    wait_for(
        lambda: process_ended(pid),
        message="exit",
    )


def test_killed_container_is_restarted_per_policy(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    # A child in its own session stands for a launcher's workers: it must die with the container.
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(600)'],"
        " start_new_session=True)\n"
        "print('child', child.pid, flush=True)\n"
        "while True: time.sleep(0.2)"
    )
    api.create(path_for("pods", namespace), pod_manifest("always", script, restartPolicy="Always"))
    wait_phase(api, namespace, "always", "Running")
    pod_dir = shared_local_cluster.pod_dir(namespace, "always")
    assert pod_dir is not None
    found = wait_for(
        lambda: re.search(r"^child (\d+)$", (pod_dir / "main.log").read_text(), re.MULTILINE),
        message="the child's pid",
    )
    child = int(found.group(1))
    assert shared_local_cluster.kill_container(namespace, "always", "main") >= 2

    def restarted() -> dict[str, Any] | None:
        pod = get_pod(api, namespace, "always")
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        return (
            pod
            if statuses[0].get("restartCount") == 1 and "running" in statuses[0].get("state", {})
            else None
        )

    pod = wait_for(restarted, timeout=60, message="the container to restart")
    assert pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    wait_for(
        lambda: process_ended(child),
        message="child killed",
    )


def test_init_containers_run_first_and_a_failed_one_fails_the_pod(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    write = {
        "name": "init",
        "image": "x",
        "command": ["python", "-c", "import sys; open(sys.argv[1], 'w').write('prepared')", "/work/ready"],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
    }
    main = pod_manifest(
        "with-init",
        "import sys; print(open(sys.argv[1]).read())",
        container={"args": ["/work/ready"], "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
        initContainers=[write],
        volumes=[{"name": "work", "emptyDir": {}}],
    )
    api.create(path_for("pods", namespace), main)
    failing = pod_manifest(
        "init-fails",
        "print('must not run')",
        initContainers=[{"name": "init", "image": "x", "command": ["python", "-c", "raise SystemExit(4)"]}],
    )
    api.create(path_for("pods", namespace), failing)

    done = wait_phase(api, namespace, "with-init", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert (
        kubectl(shared_local_cluster.kubeconfig_path, "logs", "-n", namespace, "with-init").strip()
        == "prepared"
    )

    failed = wait_phase(api, namespace, "init-fails", "Failed", "Succeeded")
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 4
    assert "running" not in failed["status"]["containerStatuses"][0]["state"]


def test_exec_readiness_probe_gates_ready_and_service_dns(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    api.create(
        path_for("services", namespace),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080}]},
        },
    )
    probe = {
        "exec": {
            "command": ["python", "-c", "import os, sys; sys.exit(not os.path.exists(sys.argv[1]))", "/s/ok"]
        },
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    manifest = pod_manifest(
        "web-0",
        PEER,
        labels={"app": "web"},
        container={"readinessProbe": probe, "volumeMounts": [{"name": "s", "mountPath": "/s"}]},
        volumes=[{"name": "s", "emptyDir": {}}],
    )
    api.create(path_for("pods", namespace), manifest)
    pod = wait_phase(api, namespace, "web-0", "Running")
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "False"
    hosts = shared_local_cluster.hosts_file
    assert f"web.{namespace}.svc" not in hosts.read_text()  # only Ready pods back a Service by default

    pod_dir = shared_local_cluster.pod_dir(namespace, "web-0")
    assert pod_dir is not None
    (pod_dir / "volumes" / "s" / "ok").touch()

    def is_ready() -> bool:
        current = api.get(path_for("pods", namespace, "web-0"))
        return any(c["type"] == "Ready" and c["status"] == "True" for c in current["status"]["conditions"])

    wait_for(is_ready, timeout=60, message="Ready after the probe succeeds")
    wait_for(
        lambda: f"web.{namespace}.svc" in hosts.read_text(), timeout=30, message="the Service's DNS record"
    )


def test_termination_message_from_the_file_or_the_log_tail(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    """The container's terminationMessagePath (default /dev/termination-log) becomes
    terminated.message; with FallbackToLogsOnError a failed container that wrote none gets its log's
    tail instead; File policy leaves it empty."""
    writes = "import sys; open(sys.argv[1], 'w').write('FaultReason: BadConfig'); sys.exit(2)"
    api.create(
        path_for("pods", namespace),
        pod_manifest("writes", writes, container={"args": ["/dev/termination-log"]}),
    )
    quiet = "import sys; print('first line'); print('the last words'); sys.exit(1)"
    for name, policy in (("tail", "FallbackToLogsOnError"), ("silent", "File")):
        api.create(
            path_for("pods", namespace),
            pod_manifest(name, quiet, container={"terminationMessagePolicy": policy}),
        )

    def message(name: str) -> str | None:
        pod = wait_phase(api, namespace, name, "Failed", "Succeeded")
        return pod["status"]["containerStatuses"][0]["state"]["terminated"].get("message")

    assert message("writes") == "FaultReason: BadConfig"
    assert message("tail") == "first line\nthe last words"
    assert message("silent") is None
