"""`rtj local` as a user runs it: up (a background daemon), status, node kill, down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from rtj_localcluster.testing import kubectl, wait_for

pytestmark = pytest.mark.slow


def rtj(state_dir: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rtj_operator.cli", "local", *args, f"--state-dir={state_dir}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_up_status_node_kill_down(tmp_path: Path) -> None:
    if os.environ.get("RTJ_TEST_KUBECONFIG"):
        pytest.skip("drives the embedded local cluster")
    state = tmp_path / "local"
    up = rtj(state, "up", "--nodes=2", "--grace-seconds=3", "--heartbeat-seconds=0.5")
    daemon_pid = None
    pod_pid = -1
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        info = json.loads((state / "daemon.json").read_text())
        daemon_pid = int(info["pid"])
        assert f"export KUBECONFIG={info['kubeconfig']}" in up.stdout
        assert (state / "daemon.json").stat().st_mode & 0o077 == 0  # the control secret is private

        nodes = kubectl(info["kubeconfig"], "get", "nodes", "-o", "name")
        assert nodes.split() == ["node/node-0", "node/node-1"]
        status = rtj(state, "status")
        assert status.returncode == 0, status.stderr
        assert "node-0" in status.stdout and "Ready" in status.stdout

        kubectl(
            info["kubeconfig"],
            "run",
            "sleeper",
            "--image=busybox",
            "--restart=Never",
            "--overrides",
            json.dumps({"spec": {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}}),
            "--command",
            "--",
            "python",
            "-c",
            "import time; time.sleep(600)",
        )

        def sleeper_pid() -> int | None:
            pod = json.loads(kubectl(info["kubeconfig"], "get", "pod", "sleeper", "-o", "json"))
            status = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
            if "running" in status.get("state", {}):
                return int(status["containerID"].removeprefix("process://"))
            return None

        pod_pid = wait_for(sleeper_pid, timeout=60, message="the sleeper pod to run")

        killed = rtj(state, "node", "kill", "node-0")
        assert killed.returncode == 0, killed.stderr

        def node0_unknown() -> bool:
            out = rtj(state, "status").stdout
            line = next((ln for ln in out.splitlines() if ln.startswith("node-0 ")), "")
            return "Unknown" in line

        wait_for(node0_unknown, timeout=60, interval=0.5, message="node-0 Unknown in `rtj local status`")
        unknown_node = rtj(state, "node", "kill", "node-9")
        assert unknown_node.returncode == 1
        assert "no node" in unknown_node.stderr
    finally:
        down = rtj(state, "down")
    assert down.returncode == 0, down.stderr
    assert daemon_pid is not None
    wait_for(lambda: not psutil.pid_exists(daemon_pid), timeout=30, message="the daemon to exit")
    assert not (state / "daemon.json").exists()
    wait_for(lambda: not psutil.pid_exists(pod_pid), timeout=30, message="the pod's process to be gone")
    assert "no local cluster is running" in rtj(state, "status").stdout
