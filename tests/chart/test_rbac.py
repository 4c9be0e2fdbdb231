"""The chart grants every API call the operator makes, and nothing broader.

The operator lists its own API calls in `rtj_operator.runtime.kube.REQUIRED_PERMISSIONS`; kopf's own
needs (CRD scanning, namespace following, events) are the documented allowlist below. Both RBAC
modes are checked: cluster-wide (ClusterRoleBinding) and per watched namespace (RoleBindings).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from chart_support import NAMESPACE, RELEASE, render, small_job
from rtj_operator.runtime.kube import LEADER_ELECTION_PERMISSIONS

# (API group, resource, verb); "" is the core group.
Permission = tuple[str, str, str]

# Resources without a namespace: only a ClusterRole can grant them.
CLUSTER_SCOPED = {
    ("", "nodes"),
    ("", "persistentvolumes"),
    ("", "namespaces"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
}

# What kopf itself needs beyond the operator's list: nothing. The operator runs kopf with resource
# scanning off (no CRD or namespace watches) and standalone (no peering objects), and kopf's own
# watches, finalizer patches and events are already in REQUIRED_PERMISSIONS. Anything kopf would
# need on top belongs here, with the reason in docs/security.md.
KOPF_ALLOWLIST: set[Permission] = set()


# Granted only when a value opts in.
def _tainting(values: dict[str, Any]) -> bool:
    return bool(values.get("nodeTainting", {}).get("enabled"))


def _fsx(values: dict[str, Any]) -> bool:
    return bool(values.get("fsx", {}).get("allowedFileSystems"))


OPT_IN: dict[Permission, Callable[[dict[str, Any]], bool]] = {
    ("", "nodes", "patch"): _tainting,
    ("", "persistentvolumes", "create"): _fsx,
    ("", "persistentvolumes", "delete"): _fsx,
}
FSX = {"fsx": {"allowedFileSystems": {"team-a": ["fs-0123456789abcdef0"]}}}

FORBIDDEN_RESOURCES = {
    "secrets",
    "configmaps",
    "clusterroles",
    "clusterrolebindings",
    "pods/exec",
    "pods/attach",
}
FORBIDDEN_VERBS = {"escalate", "bind", "impersonate", "*"}


def required_permissions() -> set[Permission]:
    from rtj_operator.runtime.kube import REQUIRED_PERMISSIONS

    return set(REQUIRED_PERMISSIONS)


def grants(objects: list[dict[str, Any]]) -> dict[str, set[Permission]]:
    """Scope ("*" for cluster-wide, else a namespace) -> permissions bound to the operator."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    result: dict[str, set[Permission]] = {}
    for binding in objects:
        if binding["kind"] not in {"ClusterRoleBinding", "RoleBinding"}:
            continue
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": f"{RELEASE}-resilient-training-operator",
                "namespace": NAMESPACE,
            }
        ]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        scope = "*" if binding["kind"] == "ClusterRoleBinding" else namespace
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule
            result.setdefault(scope, set()).update(
                (group, resource, verb)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            )
    return result


MODES: dict[str, dict[str, Any]] = {
    "all-namespaces": {},
    "all-namespaces-tainting-fsx": {"nodeTainting": {"enabled": True}, **FSX},
    "watched-namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "watched-namespaces-fsx": {"watchNamespaces": ["team-a", "team-b"], **FSX},
    "watched-namespaces-tainting": {"watchNamespaces": ["team-a"], "nodeTainting": {"enabled": True}},
}


def enabled(permission: Permission, values: dict[str, Any]) -> bool:
    opt_in = OPT_IN.get(permission)
    return opt_in is None or opt_in(values)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_permission_the_operator_uses_is_granted_where_it_needs_it(mode: str) -> None:
    values = MODES[mode]
    granted = grants(render(values))
    namespaces = values.get("watchNamespaces") or ["*"]
    for permission in sorted(required_permissions()):
        if not enabled(permission, values):
            continue
        group, resource, _ = permission
        base = resource.split("/", 1)[0]
        scopes = ["*"] if (group, base) in CLUSTER_SCOPED else namespaces
        for scope in scopes:
            assert permission in granted.get(scope, set()) | granted.get("*", set()), (permission, scope)


@pytest.mark.parametrize("mode", list(MODES))
def test_nothing_beyond_the_operator_needs_and_kopf_allowlist_is_granted(mode: str) -> None:
    values = MODES[mode]
    needed = {p for p in required_permissions() | KOPF_ALLOWLIST if enabled(p, values)}
    for scope, permissions in grants(render(values)).items():
        extra = permissions - needed - (LEADER_ELECTION_PERMISSIONS if scope == NAMESPACE else set())
        assert not extra, f"{scope}: granted but never used: {sorted(extra)}"
        for group, resource, verb in permissions:
            assert "*" not in (group, resource), (group, resource, verb)
            assert resource not in FORBIDDEN_RESOURCES, resource
            assert verb not in FORBIDDEN_VERBS, verb
        if scope != "*":
            # A namespace's Role never carries cluster-scoped kinds (it could not grant them).
            assert not {(g, r.split("/")[0]) for g, r, _ in permissions} & CLUSTER_SCOPED


def test_watched_namespaces_get_nothing_cluster_wide_but_cluster_scoped_kinds() -> None:
    granted = grants(render(MODES["watched-namespaces"]))
    assert set(granted) == {"*", "team-a", "team-b", NAMESPACE}
    assert granted[NAMESPACE] == LEADER_ELECTION_PERMISSIONS
    assert {(g, r) for g, r, _ in granted["*"]} <= CLUSTER_SCOPED
    assert granted["team-a"] == granted["team-b"]


@pytest.mark.parametrize("mode", list(MODES))
def test_leader_election_gets_its_lease_only_in_the_operator_namespace(mode: str) -> None:
    granted = grants(render(MODES[mode]))
    assert granted[NAMESPACE] >= LEADER_ELECTION_PERMISSIONS
    for scope, permissions in granted.items():
        if scope != NAMESPACE:
            assert not {r for _, r, _ in permissions} & {"leases"}, scope
    assert NAMESPACE not in grants(
        render({**MODES[mode], "leaderElection": {"enabled": False}, "replicaCount": 1})
    )


def test_without_allowed_file_systems_the_operator_cannot_touch_persistent_volumes() -> None:
    granted = grants(render({}))
    assert not {p for scope in granted.values() for p in scope if p[1] == "persistentvolumes"}
    with_fsx = grants(render(FSX))["*"]
    assert {("", "persistentvolumes", "create"), ("", "persistentvolumes", "delete")} <= with_fsx


def test_the_allow_list_reaches_the_operator_as_flags() -> None:
    values = {"fsx": {"allowedFileSystems": {"team-a": ["fs-0123456789abcdef0", "fs-0fedcba9876543210"],
                                             "*": ["fs-00000000000000001"]}}}  # fmt: skip
    (deployment,) = [o for o in render(values) if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--allow-fsx")] == [
        "--allow-fsx=*=fs-00000000000000001",
        "--allow-fsx=team-a=fs-0123456789abcdef0,fs-0fedcba9876543210",
    ]
    from rtj_operator.fsx_policy import FsxAllowList

    parsed = FsxAllowList.parse(a.removeprefix("--allow-fsx=") for a in args if a.startswith("--allow-fsx"))
    assert (
        parsed.refusal("team-b", "fs-00000000000000001", "fs-00000000000000001.fsx.us-east-1.amazonaws.com")
        is None
    )
    assert parsed.refusal(
        "team-b", "fs-0123456789abcdef0", "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com"
    )


def test_the_operator_can_neither_patch_pods_nor_grant_anything() -> None:
    """The trainers report progress through their pods' endpoints, not the API: the operator renders
    them no Role, so it needs neither `patch`/`update` on pods nor the right to create RBAC objects
    (with which it could hand out what it holds)."""
    from rtj_operator import render as renderer

    job = small_job(2)
    assert not [obj for obj in renderer.render(job) if obj["kind"] in {"Role", "RoleBinding"}]
    for values in MODES.values():
        granted = grants(render(values))
        held = granted.get("team-a", set()) | granted.get("*", set())
        assert not {("", "pods", verb) for verb in ("patch", "update")} & held
        assert not {(g, r) for g, r, _ in held if g == "rbac.authorization.k8s.io"}


def test_the_fsx_admission_policy_ships_with_an_allow_list_and_applies_to_the_operator_only() -> None:
    def policies(values: dict[str, Any]) -> list[dict[str, Any]]:
        return [o for o in render(values) if o["kind"].startswith("ValidatingAdmissionPolicy")]

    assert not policies({})
    assert not policies({"fsx": {**FSX["fsx"], "admissionPolicy": False}})
    policy, binding = sorted(policies(FSX), key=lambda o: o["kind"])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (condition,) = policy["spec"]["matchConditions"]
    account = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-resilient-training-operator"
    assert condition["expression"] == f"request.userInfo.username == '{account}'"
    allow_list = next(v for v in policy["spec"]["variables"] if v["name"] == "allowList")
    assert json.loads(allow_list["expression"]) == FSX["fsx"]["allowedFileSystems"]
