"""`rtj operator` as its users run it: a separate process with liveness, metrics and JSON logs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from operator_cluster import apply, install_crd, job_manifest, new_namespace, wait_state
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import kubectl, wait_for

pytestmark = pytest.mark.slow


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text: str = response.read().decode()
            return text
    except OSError:
        return None


def test_operator_command_serves_jobs_liveness_and_metrics(kubeconfig: Path, tmp_path: Path) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    liveness, metrics_port = reserve_port(), reserve_port()
    log = (tmp_path / "operator.log").open("w")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "rtj"),
            "operator",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
            "--liveness",
            f"http://127.0.0.1:{liveness}/healthz",
            "--metrics-port",
            str(metrics_port),
            "--log-format",
            "json",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: fetch(f"http://127.0.0.1:{liveness}/healthz"), timeout=120, message="liveness")
        nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
        instance_type = nodes[0]["metadata"]["labels"]["node.kubernetes.io/instance-type"]
        apply(kubeconfig, job_manifest("cli", namespace, nodes=1, instanceType=instance_type), tmp_path)
        wait_state(kubeconfig, namespace, "cli", "Running")
        exported = wait_for(
            lambda: (
                m
                if 'rtj_jobs{state="Running"} 1.0'
                in (m := fetch(f"http://127.0.0.1:{metrics_port}/metrics") or "")
                else None
            ),
            timeout=60,
            message="the metrics to count the running job",
        )
        assert 'rtj_reconcile_total{result="acted"}' in exported
        assert "rtj_reconcile_duration_seconds_bucket" in exported
        kubectl(kubeconfig, "-n", namespace, "delete", "rtj", "cli", "--wait=true", "--timeout=60s")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
        log.close()
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
    assert code == 0
    lines = [line for line in (tmp_path / "operator.log").read_text().splitlines() if line.strip()]
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)  # structured logs only
