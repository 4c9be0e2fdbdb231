"""`helm install` of the chart into a cluster creates the CRD, the operator and its RBAC.

Runs Helm 4's own install action (helm-python-sdk) against the embedded local cluster, or a real
cluster named by RTJ_TEST_KUBECONFIG, then uninstalls and checks what Helm keeps (the CRD).
"""

from __future__ import annotations

import json
import uuid
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


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all-namespaces", "watched-namespace"])
def test_helm_install_creates_the_operator_and_its_rbac_and_uninstall_keeps_the_crd(
    kubeconfig: Path, mode: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:6]
    release, namespace, watched = f"rtj-{suffix}", f"rtj-system-{suffix}", f"team-{suffix}"
    values: dict[str, Any] = {
        # Every cluster serves NetworkPolicy; the embedded one may not, and an unknown kind would
        # fail the whole install, so the policy follows what the cluster offers.
        "networkPolicy": {"enabled": served(kubeconfig, "networking.k8s.io", "networkpolicies")},
    }
    if mode == "watched-namespace":
        # `kubectl apply` sends JSON, which every API server decodes (`create namespace` sends protobuf).
        manifest = tmp_path / "namespace.json"
        manifest.write_text(
            json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": watched}})
        )
        kubectl(kubeconfig, "apply", "-f", str(manifest))
        values["watchNamespaces"] = [watched]
    # Release records live in memory: the install's objects are what this test is about, and
    # Helm's Secret storage writes protobuf, which the embedded API server does not decode.
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace, storage_driver="memory")
    fullname = f"{release}-resilient-training-operator"
    try:
        installed = config.install(
            CHART, release, values, namespace=namespace, create_namespace=True, timeout=120
        )
        assert installed["status"] == "deployed"

        crd = get_json(kubeconfig, "crd", CRD_NAME)
        assert crd["spec"]["names"]["kind"] == "ResilientTrainingJob"

        deployment = get_json(kubeconfig, "deployment", fullname, "-n", namespace)
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == fullname
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert exists(kubeconfig, "serviceaccount", fullname, "-n", namespace)

        # What the cluster stored is what the chart rendered, rule for rule.
        rendered = {
            (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]): obj
            for obj in render(values, namespace=namespace, release=release)
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
        kinds = sorted(kind for kind, _, _ in rendered)
        if mode == "watched-namespace":
            assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
            assert exists(kubeconfig, "role", fullname, "-n", watched)
        else:
            assert kinds == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding"]
            assert exists(kubeconfig, "clusterrole", fullname)
        assert exists(kubeconfig, "clusterrole", f"{fullname}-cluster")

        config.uninstall(release, timeout=120)
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
    finally:
        for args in (
            ["clusterrole", f"{fullname}-cluster", fullname],
            ["clusterrolebinding", f"{fullname}-cluster", fullname],
            ["namespace", namespace, watched],
        ):
            kubectl(kubeconfig, "delete", *args, "--ignore-not-found", "--wait=false", check=False)
        config.close()


@pytest.mark.slow
def test_documented_upgrade_applies_the_crd_then_moves_rbac_to_the_watched_namespaces(
    kubeconfig: Path, tmp_path: Path
) -> None:
    """docs/install.md's upgrade: `kubectl apply --server-side -f crds/`, then `helm upgrade`."""
    suffix = uuid.uuid4().hex[:6]
    release, namespace, watched = f"rtj-{suffix}", f"rtj-system-{suffix}", f"team-{suffix}"
    fullname = f"{release}-resilient-training-operator"
    base = {"networkPolicy": {"enabled": served(kubeconfig, "networking.k8s.io", "networkpolicies")}}
    manifest = tmp_path / "namespace.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": watched}}))
    kubectl(kubeconfig, "apply", "-f", str(manifest))
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace, storage_driver="memory")
    try:
        config.install(CHART, release, base, namespace=namespace, create_namespace=True, timeout=120)
        assert exists(kubeconfig, "clusterrolebinding", fullname)

        applied = kubectl(kubeconfig, "apply", "--server-side", "-f", str(CHART / "crds"))
        assert CRD_NAME in applied
        upgraded = config.upgrade(
            CHART, release, {**base, "watchNamespaces": [watched]}, namespace=namespace, timeout=120
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
        config.uninstall(release, timeout=120)
    finally:
        for args in (
            ["clusterrole", f"{fullname}-cluster", fullname],
            ["clusterrolebinding", f"{fullname}-cluster", fullname],
            ["namespace", namespace, watched],
        ):
            kubectl(kubeconfig, "delete", *args, "--ignore-not-found", "--wait=false", check=False)
        config.close()
