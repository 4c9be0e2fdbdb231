"""Object semantics of the API server: create, read, update, patch, delete, watch, and the controllers
that live inside a real kube-apiserver/kube-controller-manager and that clients rely on.

``server`` (HTTP) calls :class:`Cluster`; :class:`Cluster` reads and writes ``store`` and knows
``resources`` (the served kinds), ``schema`` (custom-object validation) and ``patch``. What it
implements: metadata bookkeeping (uid, creationTimestamp, generation on spec changes,
resourceVersion, generateName), namespaces (existence, termination with content removal), built-in
defaults that clients read back (pod phase and restartPolicy, service clusterIP, the ``default``
ServiceAccount), finalizers and deletionTimestamp, pod graceful deletion (finished by the kubelet's
DELETE with gracePeriodSeconds=0), eviction and binding, ownerReference garbage collection
(background, foreground, orphan), CRD registration with status conditions, dry runs, and the
``events.k8s.io/v1`` view of core events.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from . import patch as patches
from .errors import (
    ApiError,
    FieldError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    invalid,
    not_found,
)
from .resources import DEFAULT_NAMESPACES, CrdVersionInfo, Registry, ResourceType
from .schema import StructuralSchema
from .selectors import parse_field_selector, parse_label_selector
from .store import Key, Store, Watcher

log = logging.getLogger(__name__)

Obj = dict[str, Any]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
NAMESPACES: Key = ("", "namespaces")
PODS: Key = ("", "pods")
CRDS: Key = ("apiextensions.k8s.io", "customresourcedefinitions")
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"


def now_rfc3339(offset_seconds: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _without(obj: Obj, *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


class Cluster:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.schemas: dict[tuple[str, str, str], StructuralSchema] = {}
        # What each field manager last applied (server-side apply), to remove fields it drops.
        self._applied: dict[tuple[Key, str, str, str], Obj] = {}
        self._next_service_ip = 10
        self._gc_wakeup: asyncio.Event | None = None
        self._bootstrap()

    # -- bootstrap and helpers ---------------------------------------------------------------------

    def _bootstrap(self) -> None:
        ns_type = self.registry.get("", "v1", "namespaces")
        assert ns_type is not None
        for name in DEFAULT_NAMESPACES:
            self.create(ns_type, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        svc_type = self.registry.get("", "v1", "services")
        assert svc_type is not None
        self.create(
            svc_type,
            "default",
            {
                "metadata": {
                    "name": "kubernetes",
                    "labels": {"component": "apiserver", "provider": "kubernetes"},
                },
                "spec": {
                    "clusterIP": "10.96.0.1",
                    "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 443}],
                },
            },
        )

    def start_background(self) -> asyncio.Task[None]:
        """Start the garbage collector on the running loop; the caller cancels the task to stop it."""
        self._gc_wakeup = asyncio.Event()
        self._gc_wakeup.set()
        return asyncio.get_running_loop().create_task(self._gc_loop())

    def _wake_gc(self) -> None:
        if self._gc_wakeup is not None:
            self._gc_wakeup.set()

    def view(self, rt: ResourceType, obj: Obj) -> Obj:
        """A stored object as ``rt``'s version shows it."""
        if rt.storage_group is not None and rt.group == "events.k8s.io":
            return _core_event_to_events_v1(obj)
        if obj.get("apiVersion") != rt.api_version:
            return {**obj, "apiVersion": rt.api_version}
        return obj

    def _to_storage(self, rt: ResourceType, obj: Obj) -> Obj:
        if rt.storage_group is not None and rt.group == "events.k8s.io":
            return _events_v1_to_core_event(obj)
        return obj

    def _storage_type(self, rt: ResourceType) -> ResourceType:
        """The type whose version stored objects carry (a CRD's storage version, core for events)."""
        if rt.storage_group is not None:
            found = self.registry.get(rt.storage_group, "v1", rt.plural)
            assert found is not None
            return found
        if rt.crd_name is not None:
            crd = self.store.get(CRDS, "", rt.crd_name)
            if crd is not None:
                for version in crd["spec"].get("versions", []):
                    if version.get("storage"):
                        stored = self.registry.get(rt.group, version["name"], rt.plural)
                        if stored is not None:
                            return stored
        return rt

    def _lookup(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.store.get(rt.storage_key, namespace or "", name)
        if obj is None:
            raise not_found(rt.group, rt.plural, name)
        return obj

    def _check_namespace(self, rt: ResourceType, namespace: str | None, creating: bool) -> None:
        if not rt.namespaced:
            return
        if not namespace:
            raise bad_request("the namespace of the object must be set")
        ns = self.store.get(NAMESPACES, "", namespace)
        if ns is None:
            raise not_found("", "namespaces", namespace)
        if creating and ns["metadata"].get("deletionTimestamp"):
            raise forbidden(
                rt.group,
                rt.plural,
                "",
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )

    # -- reads -------------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        return self.view(rt, self._lookup(rt, namespace, name))

    def list_objects(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[list[Obj], str, str | None]:
        """(items, the list's resourceVersion, a continue token or None)."""
        label_match = parse_label_selector(label_selector)
        field_match = parse_field_selector(field_selector, rt.storage_key, self._selectable(rt))
        ordered = sorted(
            self.store.items(rt.storage_key, namespace if rt.namespaced else None),
            key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
        )
        if continue_token:
            start_ns, _, start_name = continue_token.partition("/")
            ordered = [
                o
                for o in ordered
                if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > (start_ns, start_name)
            ]
        items: list[Obj] = []
        next_token = None
        for obj in ordered:
            if label_match is not None and not label_match(obj):
                continue
            if field_match is not None and not field_match(obj):
                continue
            if limit and len(items) >= limit:
                last = items[-1]["metadata"]
                next_token = f"{last.get('namespace', '')}/{last['name']}"
                break
            items.append(self.view(rt, obj))
        return items, str(self.store.rv), next_token

    def _selectable(self, rt: ResourceType) -> tuple[str, ...]:
        return rt.crd.selectable_fields if rt.crd is not None else ()

    def watcher(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None, field_selector: str | None
    ) -> Watcher:
        label_match = parse_label_selector(label_selector)
        field_match = parse_field_selector(field_selector, rt.storage_key, self._selectable(rt))

        def predicate(obj: Obj) -> bool:
            return (label_match is None or label_match(obj)) and (field_match is None or field_match(obj))

        return Watcher(rt.storage_key, namespace if rt.namespaced else None, predicate)

    # -- writes ------------------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        dry_run: bool = False,
        strict_fields: bool = False,
    ) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        body = self._to_storage(rt, body)
        storage_rt = self._storage_type(rt)
        self._check_kind(rt, body)
        meta = dict(body.get("metadata") or {})
        if rt.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or meta.get("namespace")
            self._check_namespace(rt, namespace, creating=True)
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = self._generate_name(rt, namespace, meta["generateName"])
            else:
                raise invalid(
                    rt.group,
                    rt.kind,
                    "",
                    [
                        FieldError(
                            "FieldValueRequired", "metadata.name", None, "name or generateName is required"
                        )
                    ],
                )
        self._validate_name(rt, meta["name"])
        if self.store.get(rt.storage_key, namespace or "", meta["name"]) is not None:
            raise already_exists(rt.group, rt.plural, meta["name"])
        for transient in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(transient, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        obj: Obj = {**body, "apiVersion": storage_rt.api_version, "kind": rt.kind, "metadata": meta}
        if rt.crd_name is not None and rt.has_status:
            obj.pop("status", None)
        obj = self._defaults_on_create(rt, obj)
        obj = self._validate_custom(rt, obj, None, strict_fields)
        self._validate_builtin(rt, obj, None)
        if dry_run:
            return self.view(rt, obj)
        stored = self.store.put(rt.storage_key, obj, "ADDED", None)
        self._after_write(rt, stored, None)
        return self.view(rt, stored)

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        strict_fields: bool = False,
    ) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        body = self._to_storage(rt, body)
        old = self._lookup(rt, namespace, name)
        meta_in = body.get("metadata") or {}
        if meta_in.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({meta_in.get('name')}) does not match the name on the URL ({name})"
            )
        if (
            meta_in.get("resourceVersion")
            and meta_in["resourceVersion"] != old["metadata"]["resourceVersion"]
        ):
            raise conflict(
                rt.group,
                rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if meta_in.get("uid") and meta_in["uid"] != old["metadata"].get("uid"):
            raise conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {meta_in['uid']}, "
                f"UID in object meta: {old['metadata'].get('uid')}",
            )
        self._check_kind(rt, body)
        old_meta = old["metadata"]
        if subresource == "status":
            new: Obj = {**old}
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
            meta = dict(old_meta)
        else:
            new = {**body, "apiVersion": old["apiVersion"], "kind": old["kind"]}
            if rt.has_status:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            meta = dict(meta_in)
            for keep in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ):
                if keep in old_meta:
                    meta[keep] = old_meta[keep]
                else:
                    meta.pop(keep, None)
            if old_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
                if added:
                    raise invalid(
                        rt.group,
                        rt.kind,
                        name,
                        [
                            FieldError(
                                "FieldValueForbidden",
                                "metadata.finalizers",
                                None,
                                "no new finalizers can be added if the object is being deleted",
                            )
                        ],
                    )
        meta["resourceVersion"] = old_meta["resourceVersion"]
        new["metadata"] = meta
        new = self._validate_custom(rt, new, old, strict_fields)
        self._validate_builtin(rt, new, old)
        if self._spec_changed(rt, old, new):
            new["metadata"] = {**new["metadata"], "generation": int(old_meta.get("generation", 1)) + 1}
        if new == old:
            return self.view(rt, old)
        if dry_run:
            return self.view(rt, new)
        return self.view(rt, self._store_update(rt, new, old))

    def _store_update(self, rt: ResourceType, new: Obj, old: Obj) -> Obj:
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            gone = self.store.remove(rt.storage_key, new)
            self._after_remove(rt, gone)
            return gone
        stored = self.store.put(rt.storage_key, new, "MODIFIED", old)
        self._after_write(rt, stored, old)
        return stored

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        strict_fields: bool = False,
    ) -> tuple[Obj, bool]:
        """Apply a patch; returns (the object, whether it was created: server-side apply only)."""
        current = self.store.get(rt.storage_key, namespace or "", name)
        if patch_type == "apply":
            if not isinstance(body, dict):
                raise bad_request("apply configuration must be an object")
            if not field_manager:
                raise bad_request("PATCH requests of type apply require fieldManager to be set")
            applied_key = (rt.storage_key, namespace or "", name, field_manager)
            if current is None:
                config = {**body, "metadata": {**(body.get("metadata") or {}), "name": name}}
                created = self.create(rt, namespace, config, dry_run, strict_fields)
                if not dry_run and subresource is None:
                    self._applied[applied_key] = copy.deepcopy(body)
                return created, True
            base = self.view(rt, current)
            previous = self._applied.get(applied_key)
            merged = patches.apply_merge(base, body, previous, atomic_lists=rt.crd is not None)
            merged.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            result = self.update(
                rt,
                namespace,
                name,
                merged,
                subresource=subresource,
                dry_run=dry_run,
                strict_fields=strict_fields,
            )
            if not dry_run:
                self._applied[applied_key] = copy.deepcopy(body)
            return result, False
        if current is None:
            raise not_found(rt.group, rt.plural, name)
        base = self.view(rt, current)
        if patch_type == "merge":
            patched = patches.json_merge_patch(base, body)
        elif patch_type == "json":
            patched = patches.json_patch(base, body)
        elif patch_type == "strategic":
            if rt.crd is not None:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                )
            patched = patches.strategic_merge_patch(base, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {patch_type}")
        if not isinstance(patched, dict):
            raise bad_request("the patch produced a non-object")
        updated = self.update(
            rt,
            namespace,
            name,
            patched,
            subresource=subresource,
            dry_run=dry_run,
            strict_fields=strict_fields,
        )
        return updated, False

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: Obj | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """Delete (or start deleting) an object; returns the object as it is after the call."""
        options = options or {}
        obj = self._lookup(rt, namespace, name)
        meta = obj["metadata"]
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {pre['uid']}, "
                f"UID in object meta: {meta.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        policy = policy or "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise bad_request(f"unsupported propagationPolicy {policy!r}")
        grace = options.get("gracePeriodSeconds")
        if rt.storage_key == PODS:
            spec = obj.get("spec") or {}
            phase = (obj.get("status") or {}).get("phase")
            if grace is None:
                grace = spec.get("terminationGracePeriodSeconds", 30)
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                grace = 0
        else:
            grace = 0
        grace = max(int(grace), 0)
        if dry_run:
            return self.view(rt, obj)
        if policy == "Orphan":
            self._orphan_dependents(meta.get("uid", ""))
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        if rt.storage_key == NAMESPACES:
            new_meta = {
                **meta,
                "deletionTimestamp": meta.get("deletionTimestamp") or now_rfc3339(),
                "deletionGracePeriodSeconds": 0,
            }
            terminating = {
                **obj,
                "metadata": new_meta,
                "status": {**(obj.get("status") or {}), "phase": "Terminating"},
            }
            stored = self.store.put(rt.storage_key, terminating, "MODIFIED", obj)
            self._wake_gc()
            return self.view(rt, stored)
        if meta.get("deletionTimestamp"):
            # Already being deleted: only a shorter grace period (a force delete) changes anything.
            current_grace = meta.get("deletionGracePeriodSeconds") or 0
            if grace < current_grace or (grace == 0 and current_grace):
                new_meta = {**meta, "deletionGracePeriodSeconds": grace, "finalizers": finalizers}
                if grace == 0 and not finalizers:
                    gone = self.store.remove(rt.storage_key, obj)
                    self._after_remove(rt, gone)
                    return self.view(rt, gone)
                new_meta["deletionTimestamp"] = now_rfc3339(grace)
                if not finalizers:
                    new_meta.pop("finalizers", None)
                stored = self.store.put(rt.storage_key, {**obj, "metadata": new_meta}, "MODIFIED", obj)
                return self.view(rt, stored)
            if finalizers != list(meta.get("finalizers") or []):
                stored = self.store.put(
                    rt.storage_key, {**obj, "metadata": {**meta, "finalizers": finalizers}}, "MODIFIED", obj
                )
                self._wake_gc()
                return self.view(rt, stored)
            return self.view(rt, obj)
        if grace > 0 or finalizers:
            new_meta = {**meta, "deletionTimestamp": now_rfc3339(grace), "deletionGracePeriodSeconds": grace}
            if finalizers:
                new_meta["finalizers"] = finalizers
            stored = self.store.put(rt.storage_key, {**obj, "metadata": new_meta}, "MODIFIED", obj)
            self._wake_gc()
            return self.view(rt, stored)
        gone = self.store.remove(rt.storage_key, obj)
        self._after_remove(rt, gone)
        return self.view(rt, gone)

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        label_selector: str | None,
        field_selector: str | None,
        options: Obj | None,
        dry_run: bool,
    ) -> list[Obj]:
        items, _, _ = self.list_objects(
            rt, namespace, label_selector=label_selector, field_selector=field_selector
        )
        deleted = []
        for item in items:
            meta = item["metadata"]
            try:
                deleted.append(self.delete(rt, meta.get("namespace"), meta["name"], options, dry_run))
            except ApiError as error:
                if error.code != 404:
                    raise
        return deleted

    # -- pod subresources --------------------------------------------------------------------------

    def bind(self, rt: ResourceType, namespace: str, name: str, binding: Any) -> None:
        if not isinstance(binding, dict) or not (binding.get("target") or {}).get("name"):
            raise invalid("", "Binding", name, [FieldError("FieldValueRequired", "target.name", None, "")])
        pod = self._lookup(rt, namespace, name)
        node = binding["target"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict("", "pods", name, "pod is being deleted, cannot be assigned to a host")
        if (pod.get("spec") or {}).get("nodeName"):
            raise conflict(
                "", "pods", name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        status["conditions"] = conditions
        meta = dict(pod["metadata"])
        if binding.get("metadata", {}).get("annotations"):
            meta["annotations"] = {**(meta.get("annotations") or {}), **binding["metadata"]["annotations"]}
        new = {**pod, "metadata": meta, "spec": {**pod["spec"], "nodeName": node}, "status": status}
        self.store.put(rt.storage_key, new, "MODIFIED", pod)

    def evict(self, rt: ResourceType, namespace: str, name: str, eviction: Any) -> None:
        pod = self._lookup(rt, namespace, name)
        options = (eviction or {}).get("deleteOptions") if isinstance(eviction, dict) else None
        if pod["metadata"].get("deletionTimestamp") is None:
            status = dict(pod.get("status") or {})
            conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                    "lastProbeTime": None,
                    "lastTransitionTime": now_rfc3339(),
                }
            )
            status["conditions"] = conditions
            pod = self.store.put(rt.storage_key, {**pod, "status": status}, "MODIFIED", pod)
        self.delete(rt, namespace, name, options)

    # -- validation and defaults -------------------------------------------------------------------

    def _check_kind(self, rt: ResourceType, body: Obj) -> None:
        kind = body.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(f"the kind of the object ({kind}) does not match the resource ({rt.kind})")
        api_version = body.get("apiVersion")
        if api_version and api_version.rpartition("/")[0] != (
            rt.storage_group if rt.storage_group is not None and rt.group == "events.k8s.io" else rt.group
        ):
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version})"
            )

    def _generate_name(self, rt: ResourceType, namespace: str | None, prefix: str) -> str:
        for _ in range(100):
            name = prefix + "".join(random.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
            if self.store.get(rt.storage_key, namespace or "", name) is None:
                return name
        raise already_exists(rt.group, rt.plural, prefix)

    def _validate_name(self, rt: ResourceType, name: str) -> None:
        pattern = _DNS_LABEL if rt.storage_key == NAMESPACES else _DNS_SUBDOMAIN
        limit = 63 if rt.storage_key == NAMESPACES else 253
        if rt.storage_key in (
            ("rbac.authorization.k8s.io", "clusterroles"),
            ("rbac.authorization.k8s.io", "clusterrolebindings"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
        ):
            if "/" in name or name in (".", ".."):
                raise invalid(
                    rt.group,
                    rt.kind,
                    name,
                    [FieldError("FieldValueInvalid", "metadata.name", f'"{name}"', "may not contain '/'")],
                )
            return
        if len(name) > limit or not pattern.match(name):
            detail = (
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                "and must start and end with an alphanumeric character"
                if pattern is _DNS_LABEL
                else "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                "'-' or '.', and must start and end with an alphanumeric character"
            )
            raise invalid(
                rt.group,
                rt.kind,
                name,
                [FieldError("FieldValueInvalid", "metadata.name", f'"{name}"', detail)],
            )

    def _defaults_on_create(self, rt: ResourceType, obj: Obj) -> Obj:
        key = rt.storage_key
        if key == PODS:
            spec = dict(obj.get("spec") or {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
            spec.setdefault("priority", 0)
            spec.setdefault("enableServiceLinks", True)
            containers = []
            for original in spec.get("containers") or []:
                container = dict(original)
                image = str(container.get("image", ""))
                container.setdefault(
                    "imagePullPolicy",
                    "Always"
                    if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]
                    else "IfNotPresent",
                )
                container.setdefault("terminationMessagePath", "/dev/termination-log")
                container.setdefault("terminationMessagePolicy", "File")
                containers.append(container)
            if containers:
                spec["containers"] = containers
            obj = {**obj, "spec": spec, "status": {"phase": "Pending", "qosClass": _qos_class(spec)}}
        elif key == NAMESPACES:
            obj = {**obj, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
            labels = dict(obj["metadata"].get("labels") or {})
            labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
            obj["metadata"] = {**obj["metadata"], "labels": labels}
        elif key == ("", "services"):
            spec = dict(obj.get("spec") or {})
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
                spec["clusterIP"] = self._allocate_service_ip()
            if spec.get("clusterIP"):
                spec.setdefault("clusterIPs", [spec["clusterIP"]])
            ports = []
            for original_port in spec.get("ports") or []:
                port = dict(original_port)
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
                ports.append(port)
            if ports:
                spec["ports"] = ports
            obj = {**obj, "spec": spec, "status": {"loadBalancer": {}}}
        elif key in (("", "persistentvolumeclaims"), ("", "persistentvolumes")):
            obj = {**obj, "status": {"phase": "Pending"}}
        elif key == ("", "secrets"):
            obj = {**obj, "type": obj.get("type") or "Opaque"}
        elif key == CRDS:
            obj = {**obj, "status": self._crd_status(obj)}
        return obj

    def _allocate_service_ip(self) -> str:
        ip = self._next_service_ip
        self._next_service_ip += 1
        return f"10.96.{ip // 250}.{ip % 250 + 1}"

    def _validate_builtin(self, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        key = rt.storage_key
        name = obj["metadata"]["name"]
        errors: list[FieldError] = []
        if key == PODS:
            containers = (obj.get("spec") or {}).get("containers")
            if not containers:
                errors.append(FieldError("FieldValueRequired", "spec.containers", None, ""))
            for i, container in enumerate(containers or []):
                if not container.get("name"):
                    errors.append(FieldError("FieldValueRequired", f"spec.containers[{i}].name", None, ""))
                if not container.get("image"):
                    errors.append(FieldError("FieldValueRequired", f"spec.containers[{i}].image", None, ""))
            if old is not None:
                old_spec, new_spec = old.get("spec") or {}, obj.get("spec") or {}
                if old_spec.get("nodeName") and new_spec.get("nodeName") != old_spec.get("nodeName"):
                    errors.append(
                        FieldError(
                            "FieldValueForbidden",
                            "spec.nodeName",
                            None,
                            "pod updates may not change fields other than `spec.containers[*].image`, "
                            "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "
                            "`spec.tolerations` (only additions to existing tolerations) or "
                            "`spec.terminationGracePeriodSeconds`",
                        )
                    )
        elif key == CRDS:
            errors.extend(self._crd_errors(obj))
            if old is not None and obj["spec"].get("scope") != old["spec"].get("scope"):
                errors.append(
                    FieldError(
                        "FieldValueInvalid", "spec.scope", _q(obj["spec"].get("scope")), "field is immutable"
                    )
                )
        for label_value in ((obj["metadata"].get("labels")) or {}).values():
            if (
                not isinstance(label_value, str)
                or len(label_value) > 63
                or (
                    label_value and not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", label_value)
                )
            ):
                errors.append(
                    FieldError(
                        "FieldValueInvalid",
                        "metadata.labels",
                        _q(label_value),
                        "a valid label must be an empty string or consist of alphanumeric characters, "
                        "'-', '_' or '.', and must start and end with an alphanumeric character",
                    )
                )
        if errors:
            raise invalid(rt.group, rt.kind, name, errors)

    def _validate_custom(self, rt: ResourceType, obj: Obj, old: Obj | None, strict_fields: bool) -> Obj:
        if rt.crd is None:
            return obj
        schema = self.schemas.get((rt.group, rt.version, rt.plural))
        if schema is None:
            return obj
        result, errors = schema.process(obj, old)
        if strict_fields:
            unknown = _unknown_fields(obj, result)
            if unknown:
                raise bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                    "strict decoding error: " + ", ".join(f'unknown field "{path}"' for path in unknown)
                )
        if errors:
            raise invalid(rt.group, rt.kind, obj["metadata"]["name"], errors)
        return result

    def _spec_changed(self, rt: ResourceType, old: Obj, new: Obj) -> bool:
        ignored = (
            ("metadata", "status", "apiVersion", "kind")
            if (rt.has_status or rt.crd is None)
            else ("metadata", "apiVersion", "kind")
        )
        return _without(old, *ignored) != _without(new, *ignored)

    # -- after-write hooks -------------------------------------------------------------------------

    def _after_write(self, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        key = rt.storage_key
        if key == CRDS:
            self._register_crd(obj)
        elif key == NAMESPACES and old is None:
            sa_type = self.registry.get("", "v1", "serviceaccounts")
            assert sa_type is not None
            name = obj["metadata"]["name"]
            if self.store.get(sa_type.storage_key, name, "default") is None:
                self.create(sa_type, name, {"metadata": {"name": "default"}})
        refs = obj["metadata"].get("ownerReferences")
        # A new owner reference may point at an owner that is already gone: the collector decides.
        if obj["metadata"].get("deletionTimestamp") or (
            refs and refs != ((old or {}).get("metadata") or {}).get("ownerReferences")
        ):
            self._wake_gc()

    def _after_remove(self, rt: ResourceType, obj: Obj) -> None:
        key = rt.storage_key
        name = obj["metadata"]["name"]
        for applied in [
            k
            for k in self._applied
            if k[0] == key and k[1] == obj["metadata"].get("namespace", "") and k[2] == name
        ]:
            del self._applied[applied]
        if key == CRDS:
            group, plural = obj["spec"]["group"], obj["spec"]["names"]["plural"]
            for item in list(self.store.items((group, plural))):
                self.store.remove((group, plural), item)
            self.registry.remove_crd(name)
            # Watches of the removed resource end, as on a real server; clients re-list and get 404.
            self.store.close_watchers((group, plural))
            for schema_key in [k for k in self.schemas if k[0] == group and k[2] == plural]:
                del self.schemas[schema_key]
        self._wake_gc()

    # -- CustomResourceDefinitions -----------------------------------------------------------------

    def _crd_errors(self, crd: Obj) -> list[FieldError]:
        errors: list[FieldError] = []
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group = spec.get("group", "")
        if not group:
            errors.append(FieldError("FieldValueRequired", "spec.group", None, ""))
        if not names.get("plural"):
            errors.append(FieldError("FieldValueRequired", "spec.names.plural", None, ""))
        if not names.get("kind"):
            errors.append(FieldError("FieldValueRequired", "spec.names.kind", None, ""))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            errors.append(
                FieldError(
                    "FieldValueNotSupported",
                    "spec.scope",
                    _q(spec.get("scope")),
                    'supported values: "Cluster", "Namespaced"',
                )
            )
        expected = f"{names.get('plural')}.{group}"
        if crd["metadata"]["name"] != expected:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    "metadata.name",
                    _q(crd["metadata"]["name"]),
                    'must be spec.names.plural+"."+spec.group',
                )
            )
        versions = spec.get("versions") or []
        if not versions:
            errors.append(FieldError("FieldValueRequired", "spec.versions", None, ""))
        if sum(1 for v in versions if v.get("storage")) != 1:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    "spec.versions",
                    None,
                    "must have exactly one version marked as storage version",
                )
            )
        for i, version in enumerate(versions):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is None:
                errors.append(
                    FieldError(
                        "FieldValueRequired",
                        f"spec.versions[{i}].schema.openAPIV3Schema",
                        None,
                        "schemas are required",
                    )
                )
            elif schema.get("type") != "object":
                errors.append(
                    FieldError(
                        "FieldValueRequired",
                        f"spec.versions[{i}].schema.openAPIV3Schema.type",
                        None,
                        "must be object at the root",
                    )
                )
        return errors

    def _crd_status(self, crd: Obj) -> Obj:
        spec = crd.get("spec") or {}
        now = now_rfc3339()
        old = crd.get("status") or {}
        stored = list(old.get("storedVersions") or [])
        for version in spec.get("versions") or []:
            if version.get("storage") and version.get("name") not in stored:
                stored.append(version["name"])
        return {
            "acceptedNames": spec.get("names", {}),
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now,
                },
            ],
            "storedVersions": stored,
        }

    def _register_crd(self, crd: Obj) -> None:
        spec = crd["spec"]
        names = spec["names"]
        self.registry.remove_crd(crd["metadata"]["name"])
        for key in [k for k in self.schemas if k[0] == spec["group"] and k[2] == names["plural"]]:
            del self.schemas[key]
        served = []
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or {}
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            rt = ResourceType(
                group=spec["group"],
                version=version["name"],
                kind=names["kind"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                # `scale` is not served (see docs/localcluster.md), so discovery does not list it.
                subresources=frozenset({"status"} & set(subresources)),
                crd=CrdVersionInfo(
                    schema=schema,
                    printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
                    status_subresource="status" in subresources,
                    scale_subresource=subresources.get("scale"),
                    selectable_fields=tuple(
                        f.get("jsonPath", "") for f in version.get("selectableFields") or ()
                    ),
                ),
                crd_name=crd["metadata"]["name"],
            )
            self.registry.add(rt)
            served.append(version["name"])
            if schema is not None:
                compiled = StructuralSchema(schema)
                self.schemas[(rt.group, rt.version, rt.plural)] = compiled
                for problem in compiled.unsupported:
                    log.warning(
                        "CRD %s: rule not evaluated (unsupported CEL): %s", crd["metadata"]["name"], problem
                    )
        self.registry.set_group_version_order(spec["group"], _version_priority(served))

    def crd_warnings(self, crd: Obj) -> list[str]:
        """Warnings for a CRD write: the validation rules this server will not evaluate."""
        warnings: list[str] = []
        for version in (crd.get("spec") or {}).get("versions") or []:
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if isinstance(schema, dict):
                warnings.extend(
                    f"x-kubernetes-validations rule not evaluated by the local API server: {p}"
                    for p in StructuralSchema(schema).unsupported
                )
        return warnings

    # -- garbage collection and namespace termination ----------------------------------------------

    async def _gc_loop(self) -> None:
        assert self._gc_wakeup is not None
        while True:
            await self._gc_wakeup.wait()
            self._gc_wakeup.clear()
            try:
                for _ in range(100):
                    if not self.collect_garbage():
                        break
                    await asyncio.sleep(0)
            except Exception:
                log.exception("garbage collection pass failed")

    def _type_for(self, key: Key) -> ResourceType | None:
        return self.registry.by_storage_key(key)

    def collect_garbage(self) -> bool:
        """One pass of the garbage collector and the namespace controller; True if it changed anything."""
        changed = False
        live: dict[str, tuple[Key, Obj]] = {}
        for key in self.store.resource_keys():
            for obj in self.store.items(key):
                live[obj["metadata"].get("uid", "")] = (key, obj)
        blocking: dict[str, int] = {}
        for key, obj in list(live.values()):
            refs = obj["metadata"].get("ownerReferences") or []
            if not refs:
                continue
            owners = [live.get(ref.get("uid", "")) for ref in refs]
            all_gone = all(owner is None for owner in owners)
            owner_foreground = any(
                owner is not None and FOREGROUND in (owner[1]["metadata"].get("finalizers") or [])
                for owner in owners
            )
            for ref, owner in zip(refs, owners, strict=True):
                if owner is not None and ref.get("blockOwnerDeletion"):
                    blocking[ref["uid"]] = blocking.get(ref["uid"], 0) + 1
            if (all_gone or owner_foreground) and not obj["metadata"].get("deletionTimestamp"):
                rt = self._type_for(key)
                if rt is not None:
                    policy = "Foreground" if owner_foreground else "Background"
                    self.delete(
                        rt,
                        obj["metadata"].get("namespace"),
                        obj["metadata"]["name"],
                        {"propagationPolicy": policy},
                    )
                    changed = True
        for key, obj in list(live.values()):
            meta = obj["metadata"]
            finalizers = meta.get("finalizers") or []
            if not meta.get("deletionTimestamp"):
                continue
            if FOREGROUND in finalizers and not blocking.get(meta.get("uid", "")):
                self._drop_finalizer(key, obj, FOREGROUND)
                changed = True
            elif ORPHAN in finalizers:
                self._orphan_dependents(meta.get("uid", ""))
                self._drop_finalizer(key, obj, ORPHAN)
                changed = True
            elif key == NAMESPACES:
                changed |= self._terminate_namespace(obj)
        return changed

    def _drop_finalizer(self, key: Key, obj: Obj, finalizer: str) -> None:
        current = self.store.get(key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        rt = self._type_for(key)
        if current is None or rt is None:
            return
        finalizers = [f for f in current["metadata"].get("finalizers") or [] if f != finalizer]
        meta = {**current["metadata"], "finalizers": finalizers}
        if not finalizers:
            meta.pop("finalizers")
        self._store_update(rt, {**current, "metadata": meta}, current)

    def _orphan_dependents(self, uid: str) -> None:
        if not uid:
            return
        for key in self.store.resource_keys():
            for obj in list(self.store.items(key)):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == uid for ref in refs):
                    kept = [ref for ref in refs if ref.get("uid") != uid]
                    meta = {**obj["metadata"], "ownerReferences": kept}
                    if not kept:
                        meta.pop("ownerReferences")
                    self.store.put(key, {**obj, "metadata": meta}, "MODIFIED", obj)

    def _terminate_namespace(self, ns: Obj) -> bool:
        name = ns["metadata"]["name"]
        remaining = 0
        changed = False
        for key in self.store.resource_keys():
            rt = self._type_for(key)
            if rt is None or not rt.namespaced:
                continue
            for obj in list(self.store.items(key, name)):
                remaining += 1
                if not obj["metadata"].get("deletionTimestamp"):
                    self.delete(rt, name, obj["metadata"]["name"])
                    changed = True
        if remaining == 0:
            self.store.remove(NAMESPACES, ns)
            changed = True
        return changed


def _q(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def _unknown_fields(original: Any, pruned: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(original, dict) and isinstance(pruned, dict):
        for key, value in original.items():
            child = f"{path}.{key}" if path else key
            if key not in pruned:
                if value is not None:
                    found.append(child)
            else:
                found.extend(_unknown_fields(value, pruned[key], child))
    elif isinstance(original, list) and isinstance(pruned, list):
        for i, (a, b) in enumerate(zip(original, pruned, strict=False)):
            found.extend(_unknown_fields(a, b, f"{path}[{i}]"))
    return found


def _version_priority(versions: list[str]) -> list[str]:
    """Kubernetes version priority: GA before beta before alpha, higher numbers first, others last."""

    def rank(version: str) -> tuple[int, int, int, str]:
        m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
        if not m:
            return (3, 0, 0, version)
        stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
        return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)

    return sorted(versions, key=rank)


def _qos_class(spec: Obj) -> str:
    containers = spec.get("containers") or []
    requests_any = False
    guaranteed = bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        if limits or requests:
            requests_any = True
        resources_named = ("cpu", "memory")
        if (
            not limits
            or not all(k in limits for k in resources_named)
            or (requests and any(requests.get(k, limits[k]) != limits[k] for k in resources_named))
        ):
            guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"


_EVENT_RENAMES: tuple[tuple[str, str], ...] = (
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
)


def _core_event_to_events_v1(obj: Obj) -> Obj:
    out: Obj = {"apiVersion": "events.k8s.io/v1", "kind": "Event"}
    renames = dict(_EVENT_RENAMES)
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        out[renames.get(key, key)] = value
    return out


def _events_v1_to_core_event(obj: Obj) -> Obj:
    out: Obj = {"apiVersion": "v1", "kind": "Event"}
    renames = {new: old for old, new in _EVENT_RENAMES}
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        out[renames.get(key, key)] = value
    if "eventTime" in out and "firstTimestamp" not in out:
        out.setdefault("lastTimestamp", None)
    return out


__all__ = ["Cluster", "now_rfc3339"]
