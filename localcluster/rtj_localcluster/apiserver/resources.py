"""The kinds the API server serves: built-in ones and those registered by CustomResourceDefinitions.

A :class:`ResourceType` is one (group, version, resource) as discovery lists it. Objects are stored
per (group, resource) whatever the version (``storage_key``), so every served version of a CRD sees
the same objects (conversion strategy ``None``: only ``apiVersion`` changes). ``events.k8s.io/v1``
events are a view of ``core/v1`` events (``storage_key`` points there; ``core`` converts).
The registry is read by ``core`` (object semantics), ``server`` (routing, discovery) and ``openapi``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class CrdVersionInfo:
    """What a CRD declares for one served version: schema, printer columns, subresources."""

    schema: dict[str, Any] | None
    printer_columns: tuple[dict[str, Any], ...]
    status_subresource: bool
    scale_subresource: dict[str, Any] | None
    selectable_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    # Objects live under this (group, plural); differs from our own only for views (events.k8s.io).
    storage_group: str | None = None
    crd: CrdVersionInfo | None = None
    # Name of the CRD that registered this type, for removal when the CRD goes away.
    crd_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def storage_key(self) -> tuple[str, str]:
        return (self.group if self.storage_group is None else self.storage_group, self.plural)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _core(
    kind: str,
    plural: str,
    namespaced: bool = True,
    *,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType("", "v1", kind, plural, kind.lower(), namespaced, short, categories, frozenset(sub))


def _grp(
    group: str,
    version: str,
    kind: str,
    plural: str,
    namespaced: bool = True,
    *,
    short: tuple[str, ...] = (),
    sub: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    storage_group: str | None = None,
) -> ResourceType:
    return ResourceType(
        group,
        version,
        kind,
        plural,
        kind.lower(),
        namespaced,
        short,
        categories,
        frozenset(sub),
        storage_group=storage_group,
    )


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _core("Namespace", "namespaces", False, short=("ns",), sub=("status", "finalize")),
    _core(
        "Pod", "pods", True, short=("po",), sub=("status", "log", "eviction", "binding"), categories=("all",)
    ),
    _core("Node", "nodes", False, short=("no",), sub=("status",)),
    _core("Service", "services", True, short=("svc",), sub=("status",), categories=("all",)),
    _core("Endpoints", "endpoints", True, short=("ep",)),
    _core("PersistentVolume", "persistentvolumes", False, short=("pv",), sub=("status",)),
    _core("PersistentVolumeClaim", "persistentvolumeclaims", True, short=("pvc",), sub=("status",)),
    _core("ConfigMap", "configmaps", True, short=("cm",)),
    _core("Secret", "secrets", True),
    _core("ServiceAccount", "serviceaccounts", True, short=("sa",), sub=("token",)),
    _core("Event", "events", True, short=("ev",)),
    _grp("events.k8s.io", "v1", "Event", "events", True, short=("ev",), storage_group=""),
    _grp("storage.k8s.io", "v1", "StorageClass", "storageclasses", False, short=("sc",)),
    _grp("coordination.k8s.io", "v1", "Lease", "leases", True),
    _grp("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    _grp("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    _grp("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    _grp("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _grp(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        True,
        short=("deploy",),
        sub=("status",),
        categories=("all",),
    ),
    _grp(
        "apps", "v1", "ReplicaSet", "replicasets", True, short=("rs",), sub=("status",), categories=("all",)
    ),
    _grp(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        True,
        short=("sts",),
        sub=("status",),
        categories=("all",),
    ),
    _grp("apps", "v1", "DaemonSet", "daemonsets", True, short=("ds",), sub=("status",), categories=("all",)),
    _grp("batch", "v1", "Job", "jobs", True, short=(), sub=("status",), categories=("all",)),
    _grp(
        "policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, short=("pdb",), sub=("status",)
    ),
    _grp("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False, short=("pc",)),
    _grp("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, short=("netpol",)),
    _grp("networking.k8s.io", "v1", "Ingress", "ingresses", True, short=("ing",), sub=("status",)),
    _grp(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        False,
        short=("crd", "crds"),
        sub=("status",),
    ),
)

# Kinds whose list of preferred versions discovery orders first (the legacy group is always "v1").
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class Registry:
    """All served resource types, indexed the ways routing and discovery need."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        # group -> ordered versions (the first is the preferred one)
        self._group_versions: dict[str, list[str]] = {}
        for rt in BUILTIN_TYPES:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt
        versions = self._group_versions.setdefault(rt.group, [])
        if rt.version not in versions:
            versions.append(rt.version)

    def set_group_version_order(self, group: str, versions: list[str]) -> None:
        served = [v for v in versions if any(k[0] == group and k[1] == v for k in self._types)]
        if served:
            self._group_versions[group] = served

    def remove_crd(self, crd_name: str) -> None:
        gone = [key for key, rt in self._types.items() if rt.crd_name == crd_name]
        for key in gone:
            del self._types[key]
        for group in {key[0] for key in gone}:
            remaining = [v for v in self._group_versions.get(group, []) if self.resources(group, v)]
            if remaining:
                self._group_versions[group] = remaining
            else:
                self._group_versions.pop(group, None)

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def resources(self, group: str, version: str) -> list[ResourceType]:
        return [rt for (g, v, _), rt in self._types.items() if g == group and v == version]

    def groups(self) -> dict[str, list[str]]:
        return {g: list(vs) for g, vs in self._group_versions.items()}

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    def preferred(self, group: str, plural: str) -> ResourceType | None:
        for version in self._group_versions.get(group, []):
            rt = self._types.get((group, version, plural))
            if rt is not None:
                return rt
        return None

    def by_storage_key(self, key: tuple[str, str]) -> ResourceType | None:
        """The preferred type storing objects under ``key`` (a view such as events.k8s.io is skipped)."""
        rt = self.preferred(key[0], key[1])
        if rt is not None and rt.storage_key == key:
            return rt
        for candidate in self._types.values():
            if candidate.storage_key == key and candidate.storage_group is None:
                return candidate
        return None

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None


def discovery_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any]:
    """``/api/v1`` or ``/apis/<group>/<version>``: an APIResourceList with the subresources."""
    resources: list[dict[str, Any]] = []
    for rt in sorted(registry.resources(group, version), key=lambda r: r.plural):
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in sorted(rt.subresources):
            sub_kind, sub_verbs = _SUBRESOURCE_SHAPES.get(sub, (rt.kind, ["get", "patch", "update"]))
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": sub_kind,
                    "verbs": sub_verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": _gv(group, version),
        "resources": resources,
    }


_SUBRESOURCE_SHAPES: dict[str, tuple[str, list[str]]] = {
    "log": ("Pod", ["get"]),
    "eviction": ("Eviction", ["create"]),
    "binding": ("Binding", ["create"]),
    "finalize": ("Namespace", ["update"]),
    "token": ("TokenRequest", ["create"]),
    "scale": ("Scale", ["get", "patch", "update"]),
}


def _gv(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def discovery_group(registry: Registry, group: str) -> dict[str, Any]:
    versions = registry.groups().get(group, [])
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [{"groupVersion": _gv(group, v), "version": v} for v in versions],
        "preferredVersion": {"groupVersion": _gv(group, versions[0]), "version": versions[0]},
    }


def discovery_groups(registry: Registry) -> dict[str, Any]:
    groups = [discovery_group(registry, g) for g in registry.groups() if g]
    for g in groups:
        del g["kind"], g["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
