"""A real Prometheus (Debian's package, `make setup`) for the chart's tests, configured as
prometheus-operator would configure it from the chart's ServiceMonitor, PodMonitor and PrometheusRule:
the monitors become `kubernetes_sd_configs` scrape jobs (keep rules for the selectors and the named
port, the target labels prometheus-operator sets, the monitors' own relabelings and honorLabels) and
the rule's groups a rule file.

Debian builds Prometheus without Kubernetes discovery, so `KubernetesDiscovery` stands in for it: it
lists the services' endpoints and the pods of the discovery's namespaces from the API server every
second and writes them, with the `__meta_kubernetes_*` labels Prometheus's own discovery gives them,
where a `file_sd_configs` entry reads them. Prometheus's relabeling does the rest, as it would in a
cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import kubectl, stop_process, wait_for

PROMETHEUS = Path(sys.prefix) / "bin" / "prometheus"


def _label(name: str) -> str:
    """A Kubernetes label name as Prometheus's discovery spells it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _keep(meta: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"action": "keep", "source_labels": [f"{meta}_{_label(key)}"], "regex": re.escape(value)}
        for key, value in sorted(labels.items())
    ]


def _relabelings(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A monitor's relabelings (camelCase) as Prometheus's relabel_configs."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{keys.get(k, k): v for k, v in rule.items()} for rule in rules]


def _discovery(role: str, kubeconfig: Path, selector: dict[str, Any]) -> list[dict[str, Any]]:
    config: dict[str, Any] = {"role": role, "kubeconfig_file": str(kubeconfig)}
    if not selector.get("any"):
        config["namespaces"] = {"names": selector["matchNames"]}
    return [config]


def _scrape_job(
    kind: str,
    monitor: dict[str, Any],
    index: int,
    endpoint: dict[str, Any],
    role: str,
    kubeconfig: Path,
    relabel: list[dict[str, Any]],
    interval: str,
) -> dict[str, Any]:
    """One scrape job of a monitor's endpoint, as prometheus-operator names and configures it."""
    meta = monitor["metadata"]
    return {
        "job_name": f"{kind}/{meta['namespace']}/{meta['name']}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": interval,
        "kubernetes_sd_configs": _discovery(role, kubeconfig, monitor["spec"]["namespaceSelector"]),
        "relabel_configs": [*relabel, *_relabelings(endpoint.get("relabelings", []))],
    }


def service_monitor_jobs(monitor: dict[str, Any], kubeconfig: Path, interval: str) -> list[dict[str, Any]]:
    selector = monitor["spec"]["selector"]["matchLabels"]
    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["endpoints"]):
        relabel = [
            *_keep("__meta_kubernetes_service_label", selector),
            *_keep("__meta_kubernetes_endpoint_port", {"name": endpoint["port"]}),
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        jobs.append(
            _scrape_job(
                "serviceMonitor", monitor, index, endpoint, "endpoints", kubeconfig, relabel, interval
            )
        )
    return jobs


def pod_monitor_jobs(monitor: dict[str, Any], kubeconfig: Path, interval: str) -> list[dict[str, Any]]:
    meta, selector = monitor["metadata"], monitor["spec"]["selector"]["matchLabels"]
    jobs = []
    for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        relabel = [
            *_keep("__meta_kubernetes_pod_label", selector),
            *_keep("__meta_kubernetes_pod_container_port", {"name": endpoint["port"]}),
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        ]
        jobs.append(_scrape_job("podMonitor", monitor, index, endpoint, "pod", kubeconfig, relabel, interval))
    return jobs


def _endpoint_targets(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    """Role `endpoints`: one target per ready pod and port of each Service. The local cluster's pod IPs
    are loopback addresses, which the API server refuses in Endpoints objects, so each Service's
    endpoints are taken from its selector and pods, as the endpoints controller would make them."""
    pods = [p for p in _items(kubeconfig, "pods", namespace) if _ready(p)]
    groups = []
    for service in _items(kubeconfig, "services", namespace):
        selector = service["spec"].get("selector") or {}
        labels = service["metadata"].get("labels") or {}
        meta_service = {f"__meta_kubernetes_service_label_{_label(k)}": v for k, v in labels.items()}
        for pod in pods:
            if not selector or not selector.items() <= (pod["metadata"].get("labels") or {}).items():
                continue
            for port in service["spec"].get("ports") or []:
                number = _container_port(pod, port.get("targetPort", port["port"]))
                if number is None:
                    continue
                meta = {
                    "__meta_kubernetes_namespace": service["metadata"]["namespace"],
                    "__meta_kubernetes_service_name": service["metadata"]["name"],
                    "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_name": pod["metadata"]["name"],
                    **meta_service,
                }
                groups.append({"targets": [f"{pod['status']['podIP']}:{number}"], "labels": meta})
    return groups


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return bool(status.get("podIP")) and bool(ready) and ready[0].get("status") == "True"


def _container_port(pod: dict[str, Any], target: int | str) -> int | None:
    """A Service's targetPort on `pod`: a number, or the number of the container port so named."""
    if isinstance(target, int):
        return target
    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports") or [] if p.get("name") == target]
    return int(ports[0]["containerPort"]) if ports else None


def _pod_targets(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    """Role `pod`: one target per declared container port of each pod with an IP."""
    groups = []
    for pod in _items(kubeconfig, "pods", namespace):
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        labels = {
            f"__meta_kubernetes_pod_label_{_label(k)}": v
            for k, v in (pod["metadata"].get("labels") or {}).items()
        }
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                meta = {
                    "__meta_kubernetes_namespace": pod["metadata"]["namespace"],
                    "__meta_kubernetes_pod_name": pod["metadata"]["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    **labels,
                }
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": meta})
    return groups


def _items(kubeconfig: Path, resource: str, namespace: str) -> list[dict[str, Any]]:
    scope = ["--all-namespaces"] if namespace == "" else ["-n", namespace]
    out = kubectl(kubeconfig, "get", resource, *scope, "-o", "json", check=False)
    items: list[dict[str, Any]] = json.loads(out)["items"] if out.strip() else []
    return items


class KubernetesDiscovery:
    """What `kubernetes_sd_configs` would discover, written every second to the files that the
    scrape jobs' `file_sd_configs` read instead (see the module's docstring)."""

    ROLES = {"endpoints": _endpoint_targets, "pod": _pod_targets}

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._sources: list[tuple[Path, Path, str, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubernetes-discovery", daemon=True)

    def file_sd(self, job: dict[str, Any]) -> dict[str, Any]:
        """`job` with its kubernetes_sd_configs replaced by file_sd_configs this discovery feeds."""
        files = []
        for index, config in enumerate(job.pop("kubernetes_sd_configs")):
            path = self.workdir / f"{_label(job['job_name'])}-{index}.json"
            path.write_text("[]")
            namespaces = (config.get("namespaces") or {}).get("names") or [""]
            self._sources.append((path, Path(config["kubeconfig_file"]), config["role"], namespaces))
            files.append(str(path))
        return {**job, "file_sd_configs": [{"files": files, "refresh_interval": "1s"}]}

    def start(self) -> None:
        self._discover()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._discover()

    def _discover(self) -> None:
        for path, kubeconfig, role, namespaces in self._sources:
            groups = [g for namespace in namespaces for g in self.ROLES[role](kubeconfig, namespace)]
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(groups))
            temporary.replace(path)


class Prometheus:
    """`prometheus` with the scrape jobs and rule groups given, on a free loopback port."""

    def __init__(self, workdir: Path, scrape_jobs: list[dict[str, Any]], rule_groups: list[dict[str, Any]]):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups}))
        self.discovery = KubernetesDiscovery(workdir)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [self.discovery.file_sd(job) for job in scrape_jobs],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = reserve_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = (workdir / "prometheus.log").open("w")
        self.log_path = workdir / "prometheus.log"
        assert PROMETHEUS.exists(), f"{PROMETHEUS} is missing: `make setup` installs it"
        self.process = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def __enter__(self) -> Prometheus:
        self.discovery.start()
        wait_for(self._ready, timeout=60, interval=0.2, message="Prometheus to be ready")
        return self

    def __exit__(self, *exc: object) -> None:
        self.discovery.stop()
        stop_process(self.process)
        self._log.close()

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited {self.process.returncode}: {self.log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now: [{"metric": labels, "value": [t, "v"]}]."""
        result: list[dict[str, Any]] = self._get("/api/v1/query", query=expr, time=str(time.time()))["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return active

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return alerts


__all__ = ["Prometheus", "pod_monitor_jobs", "service_monitor_jobs"]
