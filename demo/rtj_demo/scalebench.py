"""`rtj bench scale`: the operator and the control plane at 1,000 nodes, on hollow nodes.

The local cluster's real API server, scheduler and controller manager, about 1,100 hollow p5.48xlarge
nodes in three zones (``rtj_localcluster.hollow``: one agent renews their Leases and moves their pods
through their phases; each worker's stand-in trainer serves the progress endpoint, one step a second),
and the operator as its own process (`rtj operator`, so that its CPU and memory are its own). Then:

1. one job of each size (10, 100, 1,000 nodes; spread over the zones, ``sameTopology: []``): apply to
   every worker created and Running; a steady window (operator CPU, API requests by verb and
   resource, the operator's writes, the progress scrape's round time, the status's size); 1% of its
   nodes lost, and at 1,000 nodes 5% and then a whole zone: the node judged NotReady by Kubernetes,
   the operator's NodeLost, the replacement created and Running, the Events and writes it took;
2. 100 concurrent 8-node jobs (each in one zone, the default): apply to children and to Running,
   p50 and p99; the operator's writes per minute while they train without changing state; its RSS.

Times are wall times at which the benchmark's own watches saw each change. Lost nodes stop renewing
their Leases: Kubernetes marks them NotReady after its grace period (40 s here, as before 1.32), and
the operator judges the worker lost `failurePolicy.nodeLossGraceSeconds` (5 here) later.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtj_localcluster.binaries import program
from rtj_localcluster.client import KubeConfig
from rtj_localcluster.cluster import LocalCluster, LocalClusterSettings
from rtj_localcluster.hollow import STEP_SECONDS_ENV, HollowSettings
from rtj_localcluster.ports import reserve_port
from rtj_operator import constants
from rtj_operator.runtime.kube import Kube

from rtj_demo.scalewatch import OperatorProbe, PodSeen, Recorder, api_request_counts, rates, start_operator

NAMESPACE = "bench"
SCRAPE_ROUND = "rtj_progress_scrape_round_seconds"
PASS = "rtj_reconcile_duration_seconds"
ZONES = ("zone-a", "zone-b", "zone-c")
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ScaleSettings:
    hollow_nodes: int = 1100
    sizes: tuple[int, ...] = (10, 100, 1000)
    concurrent_jobs: int = 100
    concurrent_nodes: int = 8
    steady_seconds: float = 30.0
    idle_seconds: float = 60.0
    lease_interval_seconds: float = 10.0
    node_monitor_grace_seconds: float = 40.0
    node_loss_grace_seconds: int = 5
    loss_timeout_seconds: float = 180.0


def job_manifest(
    name: str, nodes: int, settings: ScaleSettings, *, spread: bool, step_seconds: float
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "rtj-trainer:0.1.0",
        "nodes": nodes,
        "instanceType": "p5.48xlarge",
        "command": ["python", "train.py"],
        "env": [{"name": STEP_SECONDS_ENV, "value": str(step_seconds)}],
        "checkpoint": {"storage": {"dynamic": {"storageClassName": "local", "capacity": "1Gi"}}},
        "failurePolicy": {
            "nodeLossGraceSeconds": settings.node_loss_grace_seconds,
            "maxNodeReplacements": 10000,
            "backoffSeconds": 0,
        },
    }
    if spread:
        spec["scheduling"] = {"sameTopology": []}
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def summary(values: Sequence[float]) -> dict[str, float] | None:
    """p50, p99 and max of `values`, in seconds (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 3), "p99": round(p99, 3), "max": round(ordered[-1], 3)}


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return check()


class ScaleRun:
    """One run of the benchmark: the cluster, the operator process and the measurements."""

    def __init__(self, settings: ScaleSettings, state_dir: Path) -> None:
        self.settings = settings
        self.state_dir = state_dir
        self.cluster = LocalCluster(
            LocalClusterSettings(
                state_dir=state_dir,
                nodes=0,
                zones=ZONES,
                node_monitor_grace_seconds=settings.node_monitor_grace_seconds,
                hollow=HollowSettings(lease_interval_seconds=settings.lease_interval_seconds),
            )
        )
        self.metrics_port = reserve_port()
        self.operator: subprocess.Popen[bytes] | None = None
        self.kube: Kube | None = None
        self.recorder: Recorder | None = None
        self.probe: OperatorProbe | None = None
        self.lost: set[str] = set()

    # -- the run -------------------------------------------------------------------------------

    def __enter__(self) -> ScaleRun:
        self.cluster.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._tear_down()

    def set_up(self, log: Callable[[str], None]) -> dict[str, Any]:
        started = time.monotonic()
        self.cluster.hollow.add(self.settings.hollow_nodes, profile="p5.48xlarge", timeout=1800)
        registered = time.monotonic() - started
        log(f"{self.settings.hollow_nodes} hollow nodes Ready in {registered:.1f}s")
        kubeconfig = str(self.cluster.kubeconfig_path)
        subprocess.run(
            [str(program("kubectl")), f"--kubeconfig={kubeconfig}", "apply", "-f", str(ROOT / "crds")],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [str(program("kubectl")), f"--kubeconfig={kubeconfig}", "create", "namespace", NAMESPACE],
            check=True,
            capture_output=True,
        )
        self.operator = start_operator(
            kubeconfig, NAMESPACE, self.metrics_port, self.state_dir / "operator.log"
        )
        self.kube = Kube.from_kubeconfig(kubeconfig)
        self.probe = OperatorProbe(self.operator.pid, self.metrics_port)
        wait_until(self._operator_serving, timeout=120)
        self.recorder = Recorder(self.cluster.kubeconfig_path, NAMESPACE)
        self.recorder.start()
        return {
            "hollow_nodes": self.settings.hollow_nodes,
            "register_to_ready_seconds": round(registered, 1),
            "operator_rss_mib_idle": self.probe.rss_mib(),
        }

    def _operator_serving(self) -> bool:
        try:
            assert self.probe is not None
            self.probe.metrics()
        except OSError:
            return False
        return True

    def _tear_down(self) -> None:
        if self.recorder is not None:
            self.recorder.stop()
        if self.operator is not None:
            self.operator.terminate()
            try:
                self.operator.wait(30)
            except subprocess.TimeoutExpired:
                self.operator.kill()
        if self.kube is not None:
            self.kube.close()
        self.cluster.stop()

    # -- measurements --------------------------------------------------------------------------

    def api_counts(self) -> dict[str, float]:
        config = KubeConfig(self.cluster.kubeconfig_path)
        request = urllib.request.Request(config.server + "/metrics")
        if config.token:
            request.add_header("Authorization", f"Bearer {config.token}")

        def text() -> str:
            with urllib.request.urlopen(request, context=config.ssl_context(), timeout=30) as response:
                return str(response.read().decode())

        return api_request_counts(text)

    def window(self) -> Window:
        assert self.probe is not None and self.recorder is not None
        return Window(
            self,
            time.monotonic(),
            self.api_counts(),
            self.probe.cpu_seconds(),
            self.probe.writes(),
            self.probe.totals(SCRAPE_ROUND),
            self.probe.totals(PASS),
            self.recorder.events_seen,
        )

    def status_kib(self, name: str) -> float:
        assert self.kube is not None
        job = self.kube.get_job(NAMESPACE, name) or {}
        return round(len(json.dumps(job.get("status") or {})) / 1024, 1)

    def workers(self, name: str) -> dict[str, PodSeen]:
        assert self.recorder is not None
        return self.recorder.live_workers(name)

    def all_running(self, name: str, nodes: int) -> bool:
        found = self.workers(name)
        return len(found) == nodes and all(p.running is not None for p in found.values())


def mean_between(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The mean of a histogram's observations between two (sum, count) readings."""
    count = after[1] - before[1]
    return round((after[0] - before[0]) / count, 3) if count else None


@dataclass(frozen=True)
class Window:
    """The counters at the start of a measured window; `close()` gives what grew, per second."""

    run: ScaleRun
    started: float
    api: Mapping[str, float]
    cpu: float
    writes: float
    rounds: tuple[float, float]
    passes: tuple[float, float]
    events: int

    def close(self) -> dict[str, Any]:
        run = self.run
        assert run.probe is not None and run.recorder is not None
        seconds = max(time.monotonic() - self.started, 1e-3)
        api = run.api_counts()
        rounds, passes = run.probe.totals(SCRAPE_ROUND), run.probe.totals(PASS)
        events_written = sum(
            api.get(k, 0.0) - self.api.get(k, 0.0) for k in ("POST events", "PATCH events", "CREATE events")
        )
        return {
            "seconds": round(seconds, 1),
            "operator_cpu_cores": round((run.probe.cpu_seconds() - self.cpu) / seconds, 3),
            "operator_cpu_seconds": round(run.probe.cpu_seconds() - self.cpu, 2),
            "operator_rss_mib": run.probe.rss_mib(),
            "operator_writes": run.probe.writes() - self.writes,
            "operator_writes_per_minute": round((run.probe.writes() - self.writes) * 60 / seconds, 1),
            "scrape_round_mean_seconds": mean_between(self.rounds, rounds),
            "passes": passes[1] - self.passes[1],
            "pass_mean_seconds": mean_between(self.passes, passes),
            "events_written": events_written,
            "api_requests_per_second": round((sum(api.values()) - sum(self.api.values())) / seconds, 1),
            "api_top": rates(self.api, api, seconds),
        }
