"""Operator benchmark (run by hand): how fast and how cheaply the operator creates and keeps jobs.

    .venv/bin/python bench/operator_bench.py [--jobs-for-memory 1000] [--idle-seconds 60]

Starts the embedded local cluster in this process and the operator as a separate process
(`rtj operator`, so that its memory is its own), then measures:

- time from apply to all children created (Service, PVC, ServiceAccount and
  every worker pod) for one 1-, 16- and 64-node job, and p50/p99 over 100 concurrent 8-node jobs;
- API writes per job: the operator's own (its `rtj_api_writes_total` metric) plus every write to the
  job object (kopf's finalizer and annotations, status patches), counted from a watch;
- writes per minute while every job is idle (target 0);
- the operator's resident memory (RSS) while serving `--jobs-for-memory` jobs.

The jobs' pods go to 64 stand-in `cpu` Nodes that no kubelet runs (registered Ready once; the
controller manager's grace period is an hour, so they stay Ready): the scheduler binds the pods and
they stay Pending, so the benchmark measures the operator, not the local kubelet starting hundreds of
processes on a small machine. The operator's capacity check sees nodes that can hold every worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from rtj_demo.scalewatch import operator_metrics, start_operator
from rtj_localcluster.binaries import program
from rtj_localcluster.cluster import LocalCluster, LocalClusterSettings
from rtj_localcluster.nodes import PROFILES, node_object, node_status
from rtj_operator import constants
from rtj_operator.runtime.kube import Kube

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "default"
CHILD_KINDS = ("Service", "PersistentVolumeClaim", "ServiceAccount")


def job(name: str, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "image": "rtj-trainer:0.1.0",
            "nodes": nodes,
            "instanceType": "cpu",  # only the stand-in nodes are cpu: the pods stay Pending
            "command": ["python", "-c", "pass"],
            "checkpoint": {"storage": {"dynamic": {"storageClassName": "local", "capacity": "1Gi"}}},
        },
    }


class Writes:
    """Counts writes to job objects (ADDED excluded: that is the benchmark's own create)."""

    def __init__(self, kube: Kube) -> None:
        self.kube, self.count, self._stop = kube, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        path = f"/apis/{constants.GROUP}/{constants.VERSION}/namespaces/{NAMESPACE}/{constants.PLURAL}"
        version = self.kube.request("GET", path)["metadata"]["resourceVersion"]
        client = self.kube.api_client
        while not self._stop.is_set():
            method, url, headers, _, _ = client.param_serialize(
                "GET",
                path,
                query_params=[("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", 30)],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = client.rest_client.pool_manager.request(
                method, url, headers=headers, preload_content=False, timeout=40
            )
            for line in response:
                event = json.loads(line)
                if event["type"] == "MODIFIED":
                    self.count += 1
                version = event["object"]["metadata"].get("resourceVersion", version)
                if self._stop.is_set():
                    break

    def stop(self) -> None:
        self._stop.set()


def children_done(kube: Kube, name: str, nodes: int) -> bool:
    if len(kube.list_pods(NAMESPACE, name)) < nodes:
        return False
    for kind, child in [
        ("services", name),
        ("persistentvolumeclaims", f"{name}-checkpoints"),
        ("serviceaccounts", f"{name}-trainer"),
    ]:
        try:
            kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/{kind}/{child}")
        except Exception:
            return False
    return True


def create_and_time(kube: Kube, name: str, nodes: int, timeout: float = 600) -> float:
    started = time.monotonic()
    kube.create(job(name, nodes))
    while time.monotonic() - started < timeout:
        if children_done(kube, name, nodes):
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(f"{name}: children not created within {timeout}s")


def scrape(port: int) -> dict[str, float]:
    return operator_metrics(port)


def own_writes(port: int) -> float:
    return sum(v for k, v in scrape(port).items() if k.startswith("rtj_api_writes_total{"))


def register_stand_in_nodes(kube: Kube, count: int) -> None:
    """``count`` Ready `cpu` Nodes that no kubelet runs: pods bound to them never start."""
    for index in range(count):
        name = f"stand-in-{index}"
        kube.request("POST", "/api/v1/nodes", body=node_object(name, PROFILES["cpu"]))
        status = node_status(PROFILES["cpu"], host_ip="127.0.0.1", kubelet_port=1)
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs-for-memory", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--metrics-port", type=int, default=9477)
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="rtj-operator-bench-"))
    cluster = LocalCluster(
        LocalClusterSettings(
            state_dir=state, nodes=2, node_status_interval_seconds=30.0, node_monitor_grace_seconds=3600.0
        )
    )
    cluster.start()
    kubeconfig = str(cluster.kubeconfig_path)
    subprocess.run(
        [str(program("kubectl")), f"--kubeconfig={kubeconfig}", "apply", "-f", str(ROOT / "crds")],
        check=True,
        capture_output=True,
    )
    time.sleep(1)
    operator = start_operator(kubeconfig, NAMESPACE, args.metrics_port, state / "operator.log")
    kube = Kube.from_kubeconfig(kubeconfig)
    register_stand_in_nodes(kube, 64)
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        for _ in range(600):
            try:
                scrape(args.metrics_port)
                break
            except OSError:
                time.sleep(0.2)
        writes = Writes(kube)
        time.sleep(1)

        for nodes in (1, 16, 64):
            seconds = create_and_time(kube, f"size-{nodes}", nodes)
            results[f"apply_to_children_{nodes}_node_seconds"] = round(seconds, 3)
            print(f"{nodes}-node job: children in {seconds:.2f}s", flush=True)

        before_own, before_job = own_writes(args.metrics_port), writes.count
        with ThreadPoolExecutor(max_workers=16) as pool:
            times = list(pool.map(lambda i: create_and_time(kube, f"burst-{i}", 8), range(100)))
        time.sleep(5)  # let the last status updates land
        results["concurrent_100x8_p50_seconds"] = round(statistics.median(times), 3)
        results["concurrent_100x8_p99_seconds"] = round(percentile(times, 0.99), 3)
        results["writes_per_8_node_job_operator"] = round(
            (own_writes(args.metrics_port) - before_own) / 100, 1
        )
        results["writes_per_8_node_job_to_job_object"] = round((writes.count - before_job) / 100, 1)
        print(json.dumps(results), flush=True)

        for i in range(args.jobs_for_memory - 103):
            kube.create(job(f"mem-{i}", 1))
        deadline = time.monotonic() + 1800
        total = args.jobs_for_memory
        while time.monotonic() < deadline:
            pods = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query=[("limit", 5000)])[
                "items"
            ]
            if len(pods) >= 1 + 16 + 64 + 800 + (total - 103):
                break
            time.sleep(2)
        time.sleep(10)
        results["jobs_served"] = total
        results["operator_rss_mib_with_jobs"] = round(
            psutil.Process(operator.pid).memory_info().rss / 2**20, 1
        )

        before_own, before_job = own_writes(args.metrics_port), writes.count
        time.sleep(args.idle_seconds)
        minutes = args.idle_seconds / 60
        results["idle_writes_per_minute_operator"] = round(
            (own_writes(args.metrics_port) - before_own) / minutes, 2
        )
        results["idle_writes_per_minute_job_objects"] = round((writes.count - before_job) / minutes, 2)
        results["operator_rss_mib_after_idle"] = round(
            psutil.Process(operator.pid).memory_info().rss / 2**20, 1
        )
        writes.stop()
        print(json.dumps(results, indent=2), flush=True)
    finally:
        operator.terminate()
        try:
            operator.wait(30)
        except subprocess.TimeoutExpired:
            operator.kill()
        kube.close()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
