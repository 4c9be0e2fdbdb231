"""`kubectl exec`, `attach` and `port-forward` through the real API server to the process kubelet's
streaming endpoints (SPDY behind the API server's WebSocket translation and tunneling), with the
control plane's own unmodified kubectl."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rtj_localcluster.binaries import program
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import create_namespace, kubectl, process_ended, wait_for

pytestmark = pytest.mark.slow

SERVER_PORT = 38473
POD = "box"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("site")
    (directory / "page.txt").write_text("served from inside the pod\n")
    return directory


@pytest.fixture(scope="module")
def namespace(shared_local_cluster: LocalCluster, site: Path) -> Iterator[str]:
    """A namespace with one running pod: an HTTP server on SERVER_PORT serving ``site``."""
    config = shared_local_cluster.kubeconfig_path
    name = create_namespace(config, "exec")
    manifest = f"""
apiVersion: v1
kind: Pod
metadata: {{name: {POD}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: python:3.11
    command: [python3, -u, -m, http.server, "{SERVER_PORT}", --directory, /site]
    volumeMounts: [{{name: site, mountPath: /site}}]
  volumes: [{{name: site, hostPath: {{path: "{site}"}}}}]
"""
    subprocess.run(
        [str(program("kubectl")), f"--kubeconfig={config}", "-n", name, "apply", "-f", "-"],
        input=manifest,
        text=True,
        check=True,
        capture_output=True,
    )
    wait_for(
        lambda: "Serving HTTP" in kubectl(config, "-n", name, "logs", POD, check=False),
        timeout=60,
        message="the pod's HTTP server",
    )
    yield name
    kubectl(config, "delete", "namespace", name, "--wait=false", check=False)


def kubectl_argv(config: Path, *args: str) -> list[str]:
    return [str(program("kubectl")), f"--kubeconfig={config}", *args]


def run_kubectl(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        kubectl_argv(config, *args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_exec_exit_codes_streams_and_pod_environment(
    shared_local_cluster: LocalCluster, namespace: str
) -> None:
    config = shared_local_cluster.kubeconfig_path
    exec_ = ("-n", namespace, "exec", POD, "--")
    assert run_kubectl(config, *exec_, "true").returncode == 0

    failed = run_kubectl(config, *exec_, "sh", "-c", "exit 3")
    assert failed.returncode == 3, failed.stderr
    assert "command terminated with exit code 3" in failed.stderr

    echoed = run_kubectl(config, "-n", namespace, "exec", "-i", POD, "--", "cat", stdin="hi\n")
    assert (echoed.returncode, echoed.stdout) == (0, "hi\n"), echoed.stderr

    both = run_kubectl(config, *exec_, "sh", "-c", 'echo "out $HOSTNAME"; echo err >&2')
    assert (both.returncode, both.stdout, both.stderr) == (0, f"out {POD}\n", "err\n")

    # The command's arguments see the pod's mount paths, as the container's own do.
    assert run_kubectl(config, *exec_, "cat", "/site/page.txt").stdout == "served from inside the pod\n"

    missing = run_kubectl(config, *exec_, "no-such-command-here")
    assert missing.returncode != 0 and "no-such-command-here" in missing.stderr

    no_container = run_kubectl(config, "-n", namespace, "exec", POD, "-c", "nope", "--", "true")
    assert no_container.returncode != 0

    # -t without -i: kubectl asks for no terminal then, and the command still runs.
    assert run_kubectl(config, "-n", namespace, "exec", "-t", POD, "--", "true").returncode == 0


def test_exec_background_processes_stay_and_a_lost_client_kills_the_command(
    shared_local_cluster: LocalCluster, namespace: str
) -> None:
    config = shared_local_cluster.kubeconfig_path
    started = run_kubectl(
        config, "-n", namespace, "exec", POD, "--", "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"
    )
    assert started.returncode == 0, started.stderr
    background = psutil.Process(int(started.stdout))
    assert background.is_running() and background.status() != psutil.STATUS_ZOMBIE

    client = subprocess.Popen(
        kubectl_argv(config, "-n", namespace, "exec", POD, "--", "sh", "-c", "echo $$; exec sleep 301"),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None
    command = psutil.Process(int(client.stdout.readline()))
    client.kill()
    client.communicate()
    wait_for(
        lambda: process_ended(command.pid),
        timeout=30,
        message="the command of an exec whose client went away to end",
    )
    background.kill()


def read_until(fd: int, pattern: str, seen: bytearray, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = seen.decode(errors="replace")
        if re.search(pattern, text):
            return text
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    raise AssertionError(f"no {pattern!r} from kubectl exec -it: {bytes(seen)!r}")


def test_exec_with_a_terminal_gets_its_size_and_exit_code(
    shared_local_cluster: LocalCluster, namespace: str
) -> None:
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    process = subprocess.Popen(
        kubectl_argv(shared_local_cluster.kubeconfig_path, "-n", namespace, "exec", "-it", POD, "--", "sh"),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    seen = bytearray()
    try:
        os.write(controller, b"stty size; tty; echo sum=$((6*7))\n")
        text = read_until(controller, r"sum=42", seen)
        assert "33 111" in text and "/dev/pts/" in text
        os.write(controller, b"exit 5\n")
        assert process.wait(timeout=30) == 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)


def test_port_forward_fetches_a_page_from_the_pod(shared_local_cluster: LocalCluster, namespace: str) -> None:
    forward = subprocess.Popen(
        kubectl_argv(
            shared_local_cluster.kubeconfig_path,
            "-n",
            namespace,
            "port-forward",
            f"pod/{POD}",
            f":{SERVER_PORT}",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        first = forward.stdout.readline()
        match = re.search(rf"127\.0\.0\.1:(\d+) -> {SERVER_PORT}", first)
        assert match, f"kubectl port-forward said {first!r}"
        url = f"http://127.0.0.1:{match.group(1)}/page.txt"
        for _ in range(3):  # several connections over the one forwarding session
            with urllib.request.urlopen(url, timeout=30) as response:
                assert response.read() == b"served from inside the pod\n"
    finally:
        forward.terminate()
        forward.communicate(timeout=30)


TICKER = """
import itertools, os, sys, time
for i in itertools.count():
    print("tick", i, flush=True)
    if os.path.exists(sys.argv[1]):
        break
    time.sleep(0.2)
"""


def test_attach_follows_the_output_until_the_container_stops(
    shared_local_cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    config = shared_local_cluster.kubeconfig_path
    flag = tmp_path / "stop"
    kubectl(
        config,
        *("-n", namespace, "run", "ticker", "--image=python:3.11", "--restart=Never", "--command"),
        *("--", "python3", "-c", TICKER, str(flag)),
    )
    wait_for(
        lambda: "tick" in kubectl(config, "-n", namespace, "logs", "ticker", check=False),
        timeout=60,
        message="the ticker's first line",
    )
    attach = subprocess.Popen(
        kubectl_argv(config, "-n", namespace, "attach", "ticker"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert attach.stdout is not None
        assert attach.stdout.readline().startswith("tick"), "attach shows the container's output"
        flag.touch()
        _, err = attach.communicate(timeout=30)
        assert attach.returncode == 0, err
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.communicate()


def test_run_interactive_attaches_stdin_and_reports_the_exit_code(
    shared_local_cluster: LocalCluster, namespace: str
) -> None:
    # kubectl run -i makes a pod with stdin and stdinOnce, attaches to it, and exits with its code.
    script = 'while read x; do echo "got $x"; done; exit 7'
    result = run_kubectl(
        shared_local_cluster.kubeconfig_path,
        *("-n", namespace, "run", "-i", "--rm", "--restart=Never", "reader", "--image=python:3.11"),
        *("--command", "--", "sh", "-c", script),
        stdin="hello\nworld\n",
    )
    assert result.returncode == 7, result.stderr
    assert "got hello\ngot world\n" in result.stdout
