"""`helm install` of the chart into a cluster creates the CRD, the operator and its RBAC.

Runs Helm 4's own install action (helm-python-sdk) against the embedded local cluster, or a real
cluster named by RTJ_TEST_KUBECONFIG, then uninstalls and checks what Helm keeps (the CRD).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from chart_support import CHART, render
from rtj_localcluster.testing import kubectl, wait_for

CRD_NAME = "resilienttrainingjobs.resilient.training"


def get_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(kubectl(kubeconfig, "get", *args, "-o", "json"))
    return loaded


def exists(kubeconfig: Path, *args: str) -> bool:
    return kubectl(kubeconfig, "get", *args, "--ignore-not-found", "-o", "name").strip() != ""


def served(kubeconfig: Path, group: str, plural: str) -> bool:
    listing = kubectl(kubeconfig, "api-resources", f"--api-group={group}", "-o", "name")
    return any(line.split(".", 1)[0] == plural for line in listing.split())


@dataclass
class Release:
    """A uniquely named release, its namespace and a second namespace it may watch."""

    kubeconfig: Path
    config: helm.Config
    name: str
    namespace: str
    watched: str
    base_values: dict[str, Any]

    @property
    def fullname(self) -> str:
        return f"{self.name}-resilient-training-operator"


@pytest.fixture
def release(kubeconfig: Path, tmp_path: Path) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    name, namespace, watched = f"rtj-{suffix}", f"rtj-system-{suffix}", f"team-{suffix}"
    # `kubectl apply` sends JSON, which every API server decodes (`create namespace` sends protobuf).
    manifest = tmp_path / "namespace.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": watched}}))
    kubectl(kubeconfig, "apply", "-f", str(manifest))
    # Every cluster serves NetworkPolicy; the embedded one may not, and an unknown kind would fail
    # the whole install, so the policy follows what the cluster offers.
    base_values = {"networkPolicy": {"enabled": served(kubeconfig, "networking.k8s.io", "networkpolicies")}}
    # Release records live in memory: the install's objects are what these tests are about, and
    # Helm's Secret storage writes protobuf, which the embedded API server does not decode.
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace, storage_driver="memory")
    handle = Release(kubeconfig, config, name, namespace, watched, base_values)
    try:
        yield handle
    finally:
        fullname = handle.fullname
        for args in (
            ["clusterrole", f"{fullname}-cluster", fullname],
            ["clusterrolebinding", f"{fullname}-cluster", fullname],
            ["namespace", namespace, watched],
        ):
            kubectl(kubeconfig, "delete", *args, "--ignore-not-found", "--wait=false", check=False)
        config.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all-namespaces", "watched-namespace"])
def test_helm_install_creates_the_operator_and_its_rbac_and_uninstall_keeps_the_crd(
    release: Release, mode: str
) -> None:
    kubeconfig, namespace, watched, fullname = (
        release.kubeconfig,
        release.namespace,
        release.watched,
        release.fullname,
    )
    values = dict(release.base_values)
    if mode == "watched-namespace":
        values["watchNamespaces"] = [watched]
    installed = release.config.install(
        CHART, release.name, values, namespace=namespace, create_namespace=True, timeout=120
    )
    assert installed["status"] == "deployed"

    crd = get_json(kubeconfig, "crd", CRD_NAME)
    assert crd["spec"]["names"]["kind"] == "ResilientTrainingJob"

    deployment = get_json(kubeconfig, "deployment", fullname, "-n", namespace)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    budget = get_json(kubeconfig, "poddisruptionbudget", fullname, "-n", namespace)
    assert budget["spec"]["minAvailable"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == fullname
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert exists(kubeconfig, "serviceaccount", fullname, "-n", namespace)

    # What the cluster stored is what the chart rendered, rule for rule.
    rendered = {
        (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]): obj
        for obj in render(values, namespace=namespace, release=release.name)
        if obj["kind"] in {"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"}
    }
    for (kind, ns, name), obj in rendered.items():
        stored = get_json(kubeconfig, kind.lower(), name, *(["-n", ns] if ns else []))
        if "rules" in obj:
            assert stored["rules"] == obj["rules"], (kind, name)
        else:
            assert stored["roleRef"] == obj["roleRef"]
            assert stored["subjects"] == [
                {"kind": "ServiceAccount", "name": fullname, "namespace": namespace}
            ]
    # The Lease's Role and RoleBinding live in the release namespace in both modes.
    assert exists(kubeconfig, "role", f"{fullname}-leader-election", "-n", namespace)
    kinds = sorted(kind for kind, _, name in rendered if not name.endswith("-leader-election"))
    if mode == "watched-namespace":
        assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
        assert exists(kubeconfig, "role", fullname, "-n", watched)
    else:
        assert kinds == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding"]
        assert exists(kubeconfig, "clusterrole", fullname)
    assert exists(kubeconfig, "clusterrole", f"{fullname}-cluster")

    release.config.uninstall(release.name, timeout=120)
    wait_for(
        lambda: not exists(kubeconfig, "deployment", fullname, "-n", namespace),
        timeout=120,
        message="the Deployment to go with the release",
    )
    wait_for(
        lambda: not exists(kubeconfig, "clusterrole", f"{fullname}-cluster"),
        timeout=120,
        message="the ClusterRole to go with the release",
    )
    # Helm never deletes what it installed from crds/: the jobs survive an uninstall.
    assert exists(kubeconfig, "crd", CRD_NAME)


@pytest.mark.slow
def test_documented_upgrade_applies_the_crd_then_moves_rbac_to_the_watched_namespaces(
    release: Release,
) -> None:
    """docs/install.md's upgrade: `kubectl apply --server-side -f crds/`, then `helm upgrade`."""
    kubeconfig, namespace, watched, fullname = (
        release.kubeconfig,
        release.namespace,
        release.watched,
        release.fullname,
    )
    release.config.install(
        CHART, release.name, release.base_values, namespace=namespace, create_namespace=True, timeout=120
    )
    assert exists(kubeconfig, "clusterrolebinding", fullname)

    applied = kubectl(kubeconfig, "apply", "--server-side", "-f", str(CHART / "crds"))
    assert CRD_NAME in applied
    upgraded = release.config.upgrade(
        CHART,
        release.name,
        {**release.base_values, "watchNamespaces": [watched]},
        namespace=namespace,
        timeout=120,
    )
    assert upgraded["revision"] == 2 and upgraded["status"] == "deployed"

    wait_for(
        lambda: not exists(kubeconfig, "clusterrolebinding", fullname),
        timeout=120,
        message="the cluster-wide binding to go",
    )
    assert exists(kubeconfig, "role", fullname, "-n", watched)
    assert exists(kubeconfig, "rolebinding", fullname, "-n", watched)
    assert exists(kubeconfig, "clusterrole", f"{fullname}-cluster")
    deployment = get_json(kubeconfig, "deployment", fullname, "-n", namespace)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={watched}" in args and "--all-namespaces" not in args
    release.config.uninstall(release.name, timeout=120)
