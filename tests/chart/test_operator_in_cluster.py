"""The chart's operator as users run it: `helm install` into the local cluster's real control plane
makes a Deployment whose pod runs the operator under its own ServiceAccount and the chart's RBAC, in a
namespace that enforces Pod Security `restricted`, and a rule taken out of its ClusterRole makes it
fail loudly (the chart's operator training a job is test_operator_rbac_audit.py's scenario). A real
Prometheus configured from the chart's ServiceMonitor, PodMonitor and PrometheusRule
(tests/chart/prometheus_support.py) scrapes the operator pod and a trainer, and fires the stall alert
for a job whose worker stops advancing.

The local kubelet runs the operator image as the `rtj-operator` program of this checkout's
environment, with the service-account token the API server issued for the pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_support import CHART, one, render
from installed_support import RELEASE, get_json, operator_pod
from prometheus_support import Prometheus, pod_monitor_jobs, service_monitor_jobs
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import create_namespace, kubectl, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.local_cluster(nodes=2, profile="cpu", node_monitor_grace_seconds=5),
]
REPO = Path(__file__).resolve().parents[2]
FULLNAME = f"{RELEASE}-resilient-training-operator"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
# A worker that trains three steps, then hangs with its pod Ready (no torch: rtj-launch runs it
# directly and serves its reports at /progress and /metrics).
HANGS_AT_STEP_3 = """
import json, os, time
def rfc(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + "Z"
start = time.time()
for step in (1, 2, 3):
    time.sleep(0.3)
    report = {"v": 1, "time": rfc(time.time()), "step": step, "stepTimeSeconds": 0.3,
              "restarts": {"inProcess": 0, "inJob": 0}, "usefulStepSeconds": step * 0.3,
              "trainStartTime": rfc(start)}
    with open(os.environ["RTJ_PROGRESS_FILE"] + ".tmp", "w") as out:
        out.write(json.dumps(report))
    os.replace(os.environ["RTJ_PROGRESS_FILE"] + ".tmp", os.environ["RTJ_PROGRESS_FILE"])
time.sleep(3600)
"""


@dataclass
class Installed:
    kubeconfig: Path
    namespace: str
    team: str


def running_operator_pod(installed: Installed) -> dict[str, Any]:
    """The release's operator pod, once it runs."""
    pod: dict[str, Any] = wait_for(
        lambda: operator_pod(installed.kubeconfig, installed.namespace),
        timeout=120,
        message="the operator's pod to run",
    )
    return pod


@pytest.fixture
def installed(local_cluster: LocalCluster, tmp_path: Path) -> Iterator[Installed]:
    kubeconfig = local_cluster.kubeconfig_path
    namespace = create_namespace(kubeconfig, "rtj-system", labels=RESTRICTED)
    team = create_namespace(kubeconfig, "team")
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace, storage_driver="secret")
    # One replica (with leader election, as installed by default): the local cluster's pods share
    # the host's ports, so two replicas would clash on them. Two replicas are tested as processes
    # in tests/operator/test_operator_ha.py.
    values = {
        "replicaCount": 1,
        "operator": {"healthPort": reserve_port()},
        "metrics": {"port": reserve_port()},
    }
    try:
        result = config.install(CHART, RELEASE, values, namespace=namespace, timeout=120)
        assert result["status"] == "deployed"
        yield Installed(kubeconfig, namespace, team)
    finally:
        config.close()


def test_operator_pod_runs_as_the_charts_serviceaccount_under_pod_security_restricted(
    installed: Installed,
) -> None:
    # Training under the chart's operator (kubectl logs of a worker, its metrics scraped, its progress
    # read into status, nothing refused) is test_operator_rbac_audit.py's scenario.
    kubeconfig, namespace, team = installed.kubeconfig, installed.namespace, installed.team
    pod = running_operator_pod(installed)
    # Admitted under Pod Security `restricted`, as the chart's ServiceAccount.
    assert pod["spec"]["serviceAccountName"] == FULLNAME
    account = f"system:serviceaccount:{namespace}:{FULLNAME}"
    assert (
        kubectl(kubeconfig, "auth", "can-i", "create", "pods", "-n", team, f"--as={account}").strip() == "yes"
    )
    denied = kubectl(
        kubeconfig, "auth", "can-i", "create", "secrets", "-n", team, f"--as={account}", check=False
    )
    assert denied.strip() == "no"

    # It logged in with the token the API server issued for its pod.
    def log() -> str:
        return kubectl(kubeconfig, "logs", pod["metadata"]["name"], "-n", namespace, check=False)

    wait_for(lambda: "Initial authentication has finished" in log(), timeout=60, message="its login")
    assert "forbidden" not in log().lower(), log()


def _monitoring(installed: Installed, workdir: Path) -> Prometheus:
    """A Prometheus configured from the chart's ServiceMonitor, PodMonitor and PrometheusRule as
    this release renders them (the stall alert after 5 s instead of 5 minutes)."""
    values = {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "trainerMetrics": {"podMonitor": {"enabled": True}},
        "alerts": {"prometheusRule": {"enabled": True}, "stalledFor": "5s"},
    }
    objects = render(values, namespace=installed.namespace, release=RELEASE)
    jobs = [
        *service_monitor_jobs(one(objects, "ServiceMonitor"), installed.kubeconfig, "1s"),
        *pod_monitor_jobs(one(objects, "PodMonitor"), installed.kubeconfig, "1s"),
    ]
    return Prometheus(workdir, jobs, one(objects, "PrometheusRule")["spec"]["groups"])


def _stalled_job(team: str) -> dict[str, Any]:
    job = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    job["metadata"] = {"name": "stalled", "namespace": team}
    job["spec"].update(
        nodes=1,
        processesPerNode=1,
        command=["python", "-c", HANGS_AT_STEP_3],
        env=[{"name": "RTJ_LAUNCH_MODE", "value": "direct"}],
        progress={"stallAfterSeconds": 10},
    )
    del job["spec"]["args"]
    return job


def _firing(prometheus: Prometheus, alert: str, **labels: str) -> dict[str, Any] | None:
    found = [
        a
        for a in prometheus.alerts()
        if a["labels"]["alertname"] == alert
        and a["state"] == "firing"
        and labels.items() <= a["labels"].items()
    ]
    return found[0] if found else None


def _value(prometheus: Prometheus, expr: str) -> float | None:
    result = prometheus.query(expr)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_a_real_prometheus_scrapes_operator_and_trainer_through_the_charts_monitors_and_alerts_on_a_stall(
    installed: Installed, tmp_path: Path
) -> None:
    kubeconfig, namespace, team = installed.kubeconfig, installed.namespace, installed.team
    running_operator_pod(installed)
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(_stalled_job(team)))
    kubectl(kubeconfig, "apply", "-f", str(manifest))
    with _monitoring(installed, tmp_path / "prometheus") as prometheus:
        # The trainer's series through the PodMonitor (labelled with the job), the operator's through
        # the ServiceMonitor (the per-job ones with the job's namespace, the operator's with its own).
        step = f'rtj_trainer_step{{namespace="{team}", rtj_job="stalled", rtj_worker_index="0"}}'
        wait_for(
            lambda: _value(prometheus, step) == 3, timeout=180, message="the trainer's step in Prometheus"
        )
        job_step = f'rtj_job_step{{namespace="{team}", rtj_job="stalled"}}'
        wait_for(lambda: _value(prometheus, job_step) == 3, timeout=60, message="the operator's job series")
        assert _value(prometheus, f'rtj_operator_leading{{namespace="{namespace}"}}') == 1
        jobs = {t["labels"]["job"] for t in prometheus.targets() if t["health"] == "up"}
        assert jobs == {f"{FULLNAME}-metrics", f"{namespace}/{FULLNAME}-trainers"}, prometheus.targets()
        # Stalled for 10 s, then the alert's 5 s: it fires, with the job's namespace and name.
        alert = wait_for(
            lambda: _firing(prometheus, "RTJJobStalled", namespace=team, rtj_job="stalled"),
            timeout=120,
            interval=1,
            message="RTJJobStalled to fire",
        )
        assert alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["summary"] == f"Job {team}/stalled makes no progress"
        assert (
            _firing(prometheus, "RTJOperatorDown") is None
            and _firing(prometheus, "RTJOperatorNoLeader") is None
        )


def test_a_rule_removed_from_the_clusterrole_fails_loudly(installed: Installed, tmp_path: Path) -> None:
    kubeconfig, namespace, team = installed.kubeconfig, installed.namespace, installed.team
    pod = running_operator_pod(installed)
    role = get_json(kubeconfig, "clusterrole", FULLNAME)
    kept = [rule for rule in role["rules"] if "services" not in rule.get("resources", [])]
    assert len(kept) == len(role["rules"]) - 1
    patch = tmp_path / "rules.json"
    patch.write_text(json.dumps({"rules": kept}))
    kubectl(kubeconfig, "patch", "clusterrole", FULLNAME, "--type=merge", f"--patch-file={patch}")

    job = yaml.safe_load((REPO / "examples" / "local-cpu.yaml").read_text())
    job["metadata"] = {"name": "no-service", "namespace": team}
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    kubectl(kubeconfig, "apply", "-f", str(manifest))

    def refusal_logged() -> str | None:
        log = kubectl(kubeconfig, "logs", pod["metadata"]["name"], "-n", namespace, check=False)
        lines = [
            line for line in log.splitlines() if "is forbidden" in line and "cannot create resource" in line
        ]
        return lines[0] if lines else None

    line = wait_for(refusal_logged, timeout=120, message="the operator to log the refused create")
    assert f"system:serviceaccount:{namespace}:{FULLNAME}" in line
    assert "serviceaccounts" in line or "services" in line, line

    # The job says so too: a Blocked condition with the API server's own words, and nothing started.
    def blocked() -> dict[str, Any] | None:
        status = get_json(kubeconfig, "rtj", "no-service", "-n", team).get("status") or {}
        found = [
            c for c in status.get("conditions") or [] if c["type"] == "Blocked" and c["status"] == "True"
        ]
        return found[0] if found else None

    condition = wait_for(blocked, timeout=120, message="the job's Blocked condition")
    assert condition["reason"] == "ChildRejected"
    assert "forbidden" in condition["message"] and FULLNAME in condition["message"], condition
    assert not get_json(kubeconfig, "pods", "-n", team).get("items")
