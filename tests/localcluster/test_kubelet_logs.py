"""`kubectl logs` through the real API server to the process kubelet's log endpoint: containers by
name and by default, --tail, --previous, and -f streaming until the container exits."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rtj_localcluster.binaries import program
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, kubectl, wait_for

pytestmark = pytest.mark.slow

# Prints two lines, waits until the test creates the file named by its argument, prints a third.
TALKER = """
import os, sys, time
print("first", flush=True)
print("second", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print("after the flag", flush=True)
"""


@pytest.fixture
def namespace(shared_local_cluster: LocalCluster) -> Iterator[str]:
    name = create_namespace(shared_local_cluster.kubeconfig_path, "logs")
    yield name
    kubectl(shared_local_cluster.kubeconfig_path, "delete", "namespace", name, "--wait=false", check=False)


def pod_yaml(name: str, flag: Path) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: OnFailure
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: python:3.11
    command: [python, -c, {json.dumps(TALKER)}, {json.dumps(str(flag))}]
  - name: side
    image: python:3.11
    command: [python, -c, "import sys, time; print('side says hi', flush=True); time.sleep(600)"]
"""


def follow(kubeconfig: Path, namespace: str, *args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    process = subprocess.Popen(
        [str(program("kubectl")), f"--kubeconfig={kubeconfig}", "-n", namespace, "logs", "-f", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    return process, lines


def next_line(process: subprocess.Popen[str], lines: queue.Queue[str]) -> str:
    try:
        return lines.get(timeout=60)
    except queue.Empty:
        process.kill()
        assert process.stderr is not None
        raise AssertionError(f"no log line from kubectl logs -f: {process.stderr.read()}") from None


def test_logs_by_container_tail_and_follow_until_exit(
    shared_local_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = shared_local_cluster.kubeconfig_path
    flag = tmp_path / "flag"
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod_yaml("talker", flag))
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", str(manifest))

    def logs(*args: str) -> str:
        return kubectl(kubeconfig, "-n", namespace, "logs", "talker", *args, check=False)

    wait_for(lambda: logs("-c", "main") == "first\nsecond\n", timeout=90, message="main's two lines")
    wait_for(lambda: logs("-c", "side") == "side says hi\n", timeout=30, message="side's line")
    # Without -c kubectl takes the first container; --tail counts lines from the end.
    assert logs() == "first\nsecond\n"
    assert logs("-c", "main", "--tail=1") == "second\n"

    process, lines = follow(kubeconfig, namespace, "talker", "-c", "main")
    try:
        assert next_line(process, lines) == "first\n"
        assert next_line(process, lines) == "second\n"
        flag.write_text("go")
        assert next_line(process, lines) == "after the flag\n"
        # The container exited 0: the stream ends by itself.
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def test_previous_shows_the_last_instance_after_a_restart(
    shared_local_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = shared_local_cluster.kubeconfig_path
    flag = tmp_path / "never"
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(pod_yaml("restarted", flag))
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", str(manifest))
    wait_for(
        lambda: (
            kubectl(kubeconfig, "-n", namespace, "logs", "restarted", "-c", "main", check=False)
            == "first\nsecond\n"
        ),
        timeout=90,
        message="the first instance's lines",
    )
    shared_local_cluster.kill_container(namespace, "restarted", "main")
    wait_for(
        lambda: (
            kubectl(
                kubeconfig,
                "-n",
                namespace,
                "get",
                "pod",
                "restarted",
                "-o",
                "jsonpath={.status.containerStatuses[?(@.name=='main')].restartCount}",
                check=False,
            ).strip()
            == "1"
        ),
        timeout=90,
        message="main restarted once",
    )
    previous = kubectl(kubeconfig, "-n", namespace, "logs", "restarted", "-c", "main", "--previous")
    assert previous == "first\nsecond\n"
