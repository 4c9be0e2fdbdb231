"""Timings of the embedded local cluster: start, pod create -> process running, node kill -> Unknown,
and the controllers' idle CPU cost. Figures go to docs/localcluster.md ("Measured").

Run: .venv/bin/python bench/localcluster_timings.py [--repeat 5] [--nodes 2] [--grace 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster, LocalClusterSettings
from rtj_localcluster.testing import wait_for

# Prints the wall clock as its first act: the process's own view of "running".
STARTED = "import sys, time; open(sys.argv[1], 'w').write(repr(time.time())); time.sleep(600)"


def pod(name: str, marker: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "x", "command": ["python", "-c", STARTED, str(marker)]}],
        },
    }


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f} s"
    median = statistics.median(values)
    return f"median {median:.3f} s, min {min(values):.3f} s, max {max(values):.3f} s (n={len(values)})"


def measure_round(base: Path, nodes: int, grace: float) -> dict[str, float]:
    settings = LocalClusterSettings(
        state_dir=base / "cluster",
        nodes=nodes,
        node_monitor_grace_seconds=grace,
        heartbeat_interval_seconds=1.0,
    )
    result: dict[str, float] = {}
    began = time.monotonic()
    cluster = LocalCluster(settings)
    cluster.start()
    result["start"] = time.monotonic() - began
    try:
        own = psutil.Process()
        before = own.cpu_times()
        time.sleep(5)
        after = own.cpu_times()
        result["idle_cpu"] = (after.user + after.system - before.user - before.system) / 5 * 100

        with SyncKubeClient(cluster.kubeconfig_path) as api:
            marker = base / "started"
            created = time.time()
            created_monotonic = time.monotonic()
            api.create(path_for("pods", "default"), pod("probe", marker))

            def running() -> bool:
                obj = api.get(path_for("pods", "default", "probe"))
                statuses = obj.get("status", {}).get("containerStatuses") or [{}]
                return "running" in statuses[0].get("state", {})

            wait_for(running, interval=0.01, message="running status")
            result["running_status"] = time.monotonic() - created_monotonic
            wait_for(lambda: marker.exists() and marker.read_text(), interval=0.01, message="process")
            result["process"] = float(marker.read_text()) - created

            node = cluster.node_names[0]
            killed = time.monotonic()
            cluster.kill_node(node)
            wait_for(lambda: cluster.node_ready_status(node) == "Unknown", interval=0.01, timeout=120)
            result["unknown"] = time.monotonic() - killed
    finally:
        cluster.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--grace", type=float, default=3.0)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as scratch:
            rounds.append(measure_round(Path(scratch), args.nodes, args.grace))

    def values(key: str) -> list[float]:
        return [r[key] for r in rounds]

    print(f"nodes={args.nodes} grace={args.grace:g}s heartbeat=1s cpus={psutil.cpu_count()}")
    print(f"cluster start (API server + {args.nodes} Ready nodes): {summary(values('start'))}")
    print(f"pod create -> containerStatuses running in the API: {summary(values('running_status'))}")
    print(
        f"pod create -> the process's first instruction (incl. Python start-up): {summary(values('process'))}"
    )
    print(f"node kill -> Ready=Unknown (grace {args.grace:g}s): {summary(values('unknown'))}")
    idle = statistics.median(values("idle_cpu"))
    print(f"idle CPU of the whole cluster process ({args.nodes} nodes): {idle:.1f}% of one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
