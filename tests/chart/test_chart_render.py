"""The Helm chart lints clean, renders the objects users rely on, and rejects bad values.

Rendering goes through Helm 4's own engine (helm-python-sdk), including the values.schema.json
check that `helm install` runs before anything reaches the cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from chart_support import (
    CHART,
    CHART_CRDS,
    EXAMPLE_VALUES,
    NAMESPACE,
    REPO_CRDS,
    load_values,
    objects_of,
    one,
    render,
    small_job,
    value_sets,
)
from rtj_operator import names
from rtj_operator.nodehealth import NodeHealth

STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def test_example_values_files_exist() -> None:
    assert {path.name for path in EXAMPLE_VALUES} >= {"namespaced-values.yaml", "minimal-values.yaml"}


@pytest.mark.parametrize("values_name", list(value_sets()))
def test_lint_strict_has_no_warnings_or_errors(values_name: str) -> None:
    report = helm.lint(
        CHART, value_sets()[values_name], strict=True, namespace=NAMESPACE, kube_version="v1.32.0"
    )
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); 2 and 3 are warnings and errors.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


CLUSTER_SCOPED_KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.mark.parametrize("values_name", list(value_sets()))
def test_every_object_has_the_standard_labels_and_a_namespace_when_namespaced(values_name: str) -> None:
    objects = render(value_sets()[values_name])
    assert objects
    for obj in objects:
        labels = obj["metadata"]["labels"]
        missing = [key for key in STANDARD_LABELS if key not in labels]
        assert not missing, f"{obj['kind']}/{obj['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if obj["kind"] not in CLUSTER_SCOPED_KINDS:
            assert obj["metadata"].get("namespace"), f"{obj['kind']} has no explicit namespace"


def test_default_install_runs_two_restricted_operators_for_all_namespaces() -> None:
    objects = render()
    kinds = sorted(obj["kind"] for obj in objects)
    assert kinds == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    # Two replicas, one elected; rolled one at a time, never below one running.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": spec["selector"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        isinstance(pod["securityContext"]["runAsUser"], int) and pod["securityContext"]["runAsUser"] >= 10000
    )
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/resilient-training/rtj-operator:0.1.0"
    # A tag can move, so every start checks the registry; a digest cannot (see the namespaced test).
    assert container["imagePullPolicy"] == "Always"
    assert container["args"][:12] == [
        "--all-namespaces",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--api-read-timeout-seconds=10",
        "--watch-inactivity-seconds=15",
        "--api-stale-seconds=60",
        "--api-fatal-failures=5",
        "--leader-elect",
        "--leader-election-lease=rtj-resilient-training-operator-leader",
        "--lease-duration-seconds=10",
        "--renew-deadline-seconds=7",
        "--retry-period-seconds=2",
        "--metrics-port=9090",
    ]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    (node_health,) = container["args"][12:]
    assert node_health.startswith("--node-health={")
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"healthz": 8080, "metrics": 9090}
    assert set(container["resources"]) == {"requests", "limits"}
    # The ServiceAccount does not hand its token to every pod that uses it.
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_namespaced_example_grants_per_namespace_roles_and_watches_only_those() -> None:
    values = load_values(CHART / "ci" / "namespaced-values.yaml")
    objects = render(values)
    # The Lease's Role in the operator's own namespace is not a jobs' Role.
    roles = [r for r in objects_of(objects, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    bindings = [
        b
        for b in objects_of(objects, "RoleBinding")
        if not b["metadata"]["name"].endswith("-leader-election")
    ]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rtj-resilient-training-operator", "namespace": NAMESPACE}
        ]
    # Only the cluster-scoped rules stay cluster-wide.
    (cluster_role,) = objects_of(objects, "ClusterRole")
    assert cluster_role["metadata"]["name"].endswith("-cluster")
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in container["args"]
    assert container["image"].endswith("@" + values["image"]["digest"])
    assert container["imagePullPolicy"] == "IfNotPresent"
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= one(objects, "Service")["metadata"]["labels"].items()
    )
    policy = one(objects, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == values["networkPolicy"]["metricsFrom"]
    trainers = one(objects, "PodMonitor")
    assert trainers["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert trainers["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    (endpoint,) = trainers["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (names.PROGRESS_PORT_NAME, "/metrics")
    # It selects exactly the pods the operator renders as workers.
    worker = render_job_worker()
    assert trainers["spec"]["selector"]["matchLabels"].items() <= worker["metadata"]["labels"].items()
    assert endpoint["port"] in {p["name"] for p in worker["spec"]["containers"][0]["ports"]}


def render_job_worker() -> dict[str, Any]:
    from rtj_operator import render as renderer

    job = small_job(1)
    return renderer.render_worker_pod(job, 0)


def test_no_pod_monitor_by_default() -> None:
    objects = render(None)
    assert objects_of(objects, "PodMonitor") == [] and objects_of(objects, "ServiceMonitor") == []


def test_minimal_example_has_no_metrics_objects_and_uses_the_named_service_account() -> None:
    objects = render(load_values(CHART / "ci" / "minimal-values.yaml"))
    assert objects_of(objects, "Service") == []
    assert objects_of(objects, "ServiceAccount") == []
    assert objects_of(objects, "NetworkPolicy") == []
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "rtj-operator"
    assert not any(arg.startswith("--metrics-port") for arg in pod["containers"][0]["args"])
    for binding in objects_of(objects, "ClusterRoleBinding"):
        assert binding["subjects"][0]["name"] == "rtj-operator"


def test_without_leader_election_one_replica_is_recreated_and_more_are_refused() -> None:
    objects = render({"leaderElection": {"enabled": False}, "replicaCount": 1})
    spec = one(objects, "Deployment")["spec"]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    assert objects_of(objects, "PodDisruptionBudget") == [] and objects_of(objects, "Role") == []
    assert "--leader-elect" not in spec["template"]["spec"]["containers"][0]["args"]
    with pytest.raises(Exception, match=r"replicaCount > 1 needs leaderElection\.enabled"):
        render({"leaderElection": {"enabled": False}})


def test_node_patch_is_granted_only_when_tainting_is_enabled() -> None:
    def node_verbs(values: dict[str, Any] | None) -> set[str]:
        rules = [rule for role in objects_of(render(values), "ClusterRole") for rule in role["rules"]]
        return {verb for rule in rules if "nodes" in rule["resources"] for verb in rule["verbs"]}

    assert node_verbs(None) == {"get", "list", "watch"}
    assert node_verbs({"nodeTainting": {"enabled": True}}) == {"get", "list", "watch", "patch"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"metrics": {"port": "9090"}}, "/metrics/port"),
        ({"metrics": {"port": 80}}, "/metrics/port"),
        ({"imagee": {"tag": "1.0"}}, "imagee"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
        ({"resources": {"limits": {"cpus": "1"}}}, "cpus"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
        ({"securityContext": {"privileged": True}}, "privileged"),
        ({"tolerations": [{"key": "a", "operator": "Matches"}]}, "/tolerations/0/operator"),
        ({"metrics": {"serviceMonitor": {"interval": "soon"}}}, "/metrics/serviceMonitor/interval"),
        ({"livenessProbe": {"periodSeconds": 0}}, "/livenessProbe/periodSeconds"),
        ({"nodeHealth": {"conditions": {"KernelDeadlock": "Yes"}}}, "/nodeHealth/conditions/KernelDeadlock"),
        ({"nodeHealth": {"trainerFaultThreshold": -1}}, "/nodeHealth/trainerFaultThreshold"),
        ({"nodeHealth": {"cordon": True}}, "cordon"),
        ({"nodeHealth": {"noticeLabels": {"example.com/spot-notice": "true"}}}, "/nodeHealth/noticeLabels"),
        ({"fsx": {"allowedFileSystems": {"team-a": ["efs-0123"]}}}, "/fsx/allowedFileSystems/team-a/0"),
        ({"fsx": {"allowedFileSystems": {"team-a": []}}}, "/fsx/allowedFileSystems/team-a"),
        ({"fsx": {"allowedFileSystems": {"Team_A": ["*"]}}}, "invalid propertyName 'Team_A'"),
        ({"fsx": {"allowedFilesystems": {}}}, "allowedFilesystems"),
    ],
)
def test_schema_rejects_bad_values_before_rendering(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(values)


def test_service_monitor_without_a_metrics_service_fails_with_a_clear_message() -> None:
    with pytest.raises(helm.HelmError, match=re.escape("serviceMonitor.enabled needs")):
        render({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}})


def test_existing_service_account_must_be_named() -> None:
    with pytest.raises(helm.HelmError, match=re.escape("serviceAccount.name is required")):
        render({"serviceAccount": {"create": False}})


def test_values_file_documents_every_key() -> None:
    """Each value has a comment right above it, or sits in a block whose key is commented."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented: list[str] = []
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    previous = ""
    for line in lines:
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "-")) and ":" in stripped:
            indent = len(line) - len(line.lstrip())
            while stack and stack[-1][0] >= indent:
                stack.pop()
            documented = previous.startswith("#") or any(doc for _, doc in stack)
            key, _, rest = stripped.partition(":")
            if rest.strip() and not documented:
                undocumented.append(key)
            stack.append((indent, documented))
        if stripped:
            previous = stripped
    assert undocumented == []


def test_chart_crds_are_identical_to_the_generated_ones() -> None:
    """Helm installs the chart's crds/ copy: it must be byte-for-byte the generated crds/."""
    repo_files = {path.name: path.read_bytes() for path in REPO_CRDS.glob("*.yaml")}
    chart_files = {path.name: path.read_bytes() for path in CHART_CRDS.glob("*.yaml")}
    assert repo_files, "crds/ is empty: run `make crds`"
    assert chart_files.keys() == repo_files.keys(), "run scripts/sync-chart-crds.sh"
    for name, content in repo_files.items():
        assert chart_files[name] == content, f"{name} differs: run scripts/sync-chart-crds.sh"


def test_chart_crd_is_installed_by_helm() -> None:
    """Helm picks the CRD up from crds/ (loaded with the chart, outside the templates)."""
    crds = helm.Chart.load(CHART).crds
    assert [Path(crd["name"]).name for crd in crds] == sorted(path.name for path in CHART_CRDS.glob("*.yaml"))


@pytest.mark.parametrize("values_name", list(value_sets()))
def test_operator_accepts_the_arguments_the_chart_passes(values_name: str) -> None:
    from rtj_operator.main import build_parser

    (container,) = one(render(value_sets()[values_name]), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    args = build_parser().parse_args(container["args"])
    watched = (value_sets()[values_name] or {}).get("watchNamespaces", [])
    assert args.namespace == watched
    assert args.all_namespaces is (not watched)
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    # No value set changes nodeHealth: the chart's defaults are the operator's own.
    assert args.node_health == NodeHealth()


def test_node_health_values_reach_the_operator_merged_with_the_defaults() -> None:
    from rtj_operator.main import build_parser

    values = {
        "nodeHealth": {
            "conditions": {"KernelDeadlock": None, "GPUMissing": "True"},
            "replaceOnCordon": False,
            "trainerFaultThreshold": 5,
            "noticeLabels": {"example.com/spot-notice": ["true"]},
            "disruptionTaints": ["example.com/maintenance"],
        }
    }
    (container,) = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"]
    health = build_parser().parse_args(container["args"]).node_health
    assert health.trainer_fault_threshold == 5 and health.replace_on_cordon is False
    assert health.conditions["GPUMissing"] == "True" and "KernelDeadlock" not in health.conditions
    assert health.conditions["AcceleratedHardwareReady"] == "False"  # a default kept by the merge
    assert health.labels == NodeHealth().labels and health.permanent == NodeHealth().permanent
    assert health.notice_labels == {"example.com/spot-notice": ("true",)}
    assert health.disruption_taints == ("example.com/maintenance",) and health.disruption_labels == {}
