"""Helm 4 (the real binary, installed by scripts/install-helm.sh) installs, upgrades and uninstalls
a chart on the embedded API server: its release storage (protobuf-encoded Secrets) and server-side
apply of the chart's objects."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rtj_localcluster.apiserver import ApiServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / ".venv" / "bin" / "helm"


def _helm_binary() -> str:
    if HELM.exists():
        return str(HELM)
    found = shutil.which("helm")
    if found is None:
        pytest.skip("helm is not installed: run `make setup` (scripts/install-helm.sh)")
    return found


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("api"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    root = tmp_path / "tiny"
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (root / "values.yaml").write_text("greeting: hello\nreplicas: 1\n")
    (root / "templates" / "config.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    (root / "templates" / "rbac.yaml").write_text(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {{ .Release.Name }}\n---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {{ .Release.Name }}\n"
        "rules:\n- apiGroups: ['']\n  resources: [pods]\n  verbs: [get, list]\n---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n"
        "metadata:\n  name: {{ .Release.Name }}\n"
        "roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: '{{ .Release.Name }}'}\n"
        "subjects:\n- {kind: ServiceAccount, name: '{{ .Release.Name }}'}\n"
    )
    return root


@pytest.fixture
def run(api: ApiServer, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {
        **os.environ,
        "KUBECONFIG": str(api.kubeconfig_path),
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
        "HELM_DATA_HOME": str(tmp_path / "data"),
    }

    def go(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        binary = _helm_binary() if tool == "helm" else tool
        result = subprocess.run(
            [binary, *args], env=env, capture_output=True, text=True, timeout=180, check=False
        )
        assert result.returncode == 0, f"{tool} {' '.join(args)}: {result.stderr}"
        return result

    return go


def test_helm_install_upgrade_uninstall(
    run: Callable[..., subprocess.CompletedProcess[str]], chart: Path
) -> None:
    assert (
        "STATUS: deployed" in run("helm", "install", "demo", str(chart), "--wait", "--timeout", "120s").stdout
    )
    assert json.loads(run("kubectl", "get", "configmap", "demo-config", "-o", "json").stdout)["data"] == {
        "greeting": "hello"
    }
    run("kubectl", "get", "serviceaccount/demo", "role/demo", "rolebinding/demo")
    releases = json.loads(run("helm", "list", "-o", "json").stdout)
    assert [(r["name"], r["status"], r["revision"]) for r in releases] == [("demo", "deployed", "1")]

    run("helm", "upgrade", "demo", str(chart), "--set", "greeting=bye", "--wait", "--timeout", "120s")
    assert (
        run("kubectl", "get", "configmap", "demo-config", "-o", "jsonpath={.data.greeting}").stdout == "bye"
    )
    history = json.loads(run("helm", "history", "demo", "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]

    run("helm", "uninstall", "demo", "--wait", "--timeout", "120s")
    remaining = run("kubectl", "get", "configmaps,secrets,roles", "-o", "name").stdout
    assert "demo" not in remaining


def test_helm_installs_the_projects_chart(run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    chart = REPO / "charts" / "resilient-training-operator"
    run("helm", "install", "rtj", str(chart), "-n", "rtj-system", "--create-namespace", "--timeout", "120s")
    run("kubectl", "get", "crd", "resilienttrainingjobs.resilient.training")
    deployments = json.loads(run("kubectl", "get", "deployments", "-n", "rtj-system", "-o", "json").stdout)[
        "items"
    ]
    assert [d["metadata"]["labels"]["app.kubernetes.io/managed-by"] for d in deployments] == ["Helm"]
    run("kubectl", "get", "serviceaccounts,services,networkpolicies", "-n", "rtj-system")
    run("helm", "uninstall", "rtj", "-n", "rtj-system", "--wait", "--timeout", "120s")
    assert (
        json.loads(run("kubectl", "get", "deployments", "-n", "rtj-system", "-o", "json").stdout)["items"]
        == []
    )
