"""`rtj operator` as its users run it: a separate process with liveness, metrics and JSON logs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from api_proxy import ApiProxy, kubeconfig_via
from operator_cluster import apply, install_crd, job_manifest, job_status, new_namespace, wait_state
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator.runtime import quiet_logs

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
        assert "rtj_operator_leading 1.0" in exported  # the only replica, without leader election
        assert f'rtj_job_state{{namespace="{namespace}",rtj_job="cli",state="Running"}} 1.0' in exported
        assert f'rtj_job_failures_allowed{{namespace="{namespace}",rtj_job="cli"}} 10.0' in exported
        kubectl(kubeconfig, "-n", namespace, "delete", "rtj", "cli", "--wait=true", "--timeout=60s")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
        log.close()
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
    assert code == 0
    lines = [line for line in (tmp_path / "operator.log").read_text().splitlines() if line.strip()]
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)  # structured logs only


def _failure_lines(log: Path) -> dict[str, int]:
    """Warning and error lines of a JSON log by failure class (the message where it names none)."""
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("severity") not in {"warn", "error"}:
            continue
        named = quiet_logs.NAMED_FAILURE.findall(entry["message"])
        key = named[-1] if named else entry["message"]
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_45_s_api_outage_leaves_a_few_log_lines_per_failure_class(kubeconfig: Path, tmp_path: Path) -> None:
    """Every retry of every watch and health check used to log a line: measured without the filter,
    20 lines from the outage on, 10 of them one ConnectionTimeoutError after another; with it, 7."""
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    with ApiProxy(server) as proxy:
        via = kubeconfig_via(kubeconfig, proxy, tmp_path / "via-proxy.kubeconfig")
        log_path = tmp_path / "operator.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [
                    *(str(Path(sys.executable).parent / "rtj"), "operator", "--kubeconfig", str(via)),
                    *("--namespace", namespace, "--log-format", "json"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
                instance_type = nodes[0]["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                job = job_manifest("quiet", namespace, nodes=1, instanceType=instance_type)
                apply(kubeconfig, job, tmp_path)
                wait_state(kubeconfig, namespace, "quiet", "Running")
                before = len(log_path.read_text().splitlines())
                proxy.outage()
                time.sleep(45)
                proxy.heal()
                kubectl(kubeconfig, "-n", namespace, "delete", "pod", "quiet-worker-0", "--wait=false")
                wait_for(
                    lambda: (job_status(kubeconfig, namespace, "quiet").get("restarts") or {}).get("total"),
                    timeout=120,
                    message="the operator to serve again after the outage",
                )
                time.sleep(2)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    counts = _failure_lines(log_path)
    lines = log_path.read_text().splitlines()[before:]
    print(f"\n{len(lines)} log lines from the outage on; failure lines by class: {counts}")
    assert counts, "the outage logged no failure at all"
    assert max(counts.values()) <= 3, counts
