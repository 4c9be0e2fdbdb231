"""Server-side printing: ``meta.k8s.io/v1`` Tables for ``kubectl get``.

kubectl asks for ``application/json;as=Table;v=v1;g=meta.k8s.io``; ``server`` then calls
:func:`table` for a list or a single object. Custom resources use the CRD's
``additionalPrinterColumns`` (JSONPath from ``jsonpath``); built-in kinds have columns like a real
API server's (Pods: NAME READY STATUS RESTARTS AGE ...), and any other kind gets NAME AGE.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .jsonpath import evaluate
from .resources import ResourceType

Column = tuple[str, str, str, int, Callable[[dict[str, Any]], Any]]  # name, type, format, priority, getter


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def human_duration(seconds: float) -> str:
    """Go's ``duration.HumanDuration``, which kubectl's AGE columns use."""
    if seconds < -1:
        return "<invalid>"
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 - (hours // 24 // 365) * 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def age(timestamp: str | None) -> str:
    when = parse_time(timestamp)
    if when is None:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - when).total_seconds())


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = obj.get("metadata") or {}
    return meta


def _name(obj: dict[str, Any]) -> Any:
    return _meta(obj).get("name", "")


def _age(obj: dict[str, Any]) -> Any:
    return age(_meta(obj).get("creationTimestamp"))


NAME: Column = ("Name", "string", "name", 0, _name)
AGE: Column = ("Age", "string", "", 0, _age)


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{total}"


def _pod_status(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    for cs in status.get("initContainerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" in state and state["terminated"].get("exitCode", 0) != 0:
            reason = "Init:" + (state["terminated"].get("reason") or "Error")
            break
        if "waiting" in state and state["waiting"].get("reason") not in (None, "PodInitializing"):
            reason = "Init:" + state["waiting"]["reason"]
            break
    else:
        running = False
        for cs in reversed(status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            if state.get("waiting", {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif "terminated" in state:
                term = state["terminated"]
                reason = term.get("reason") or (
                    f"Signal:{term['signal']}"
                    if term.get("signal")
                    else f"ExitCode:{term.get('exitCode', 0)}"
                )
            elif "running" in state and cs.get("ready"):
                running = True
        if reason == "Completed" and running:
            reason = "Running"
    if _meta(pod).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return str(reason)


def _pod_restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(s.get("restartCount", 0)) for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _node_status(node: dict[str, Any]) -> str:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    text = "Unknown"
    if ready is not None:
        text = {"True": "Ready", "False": "NotReady"}.get(ready.get("status"), "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    return text


def _node_roles(node: dict[str, Any]) -> str:
    roles = sorted(
        key.split("/", 1)[1]
        for key in (_meta(node).get("labels") or {})
        if key.startswith("node-role.kubernetes.io/") and key.split("/", 1)[1]
    )
    return ",".join(roles) or "<none>"


def _node_address(kind: str) -> Callable[[dict[str, Any]], Any]:
    def get(node: dict[str, Any]) -> Any:
        for address in (node.get("status") or {}).get("addresses") or []:
            if address.get("type") == kind:
                return address.get("address")
        return "<none>"

    return get


def _service_ports(svc: dict[str, Any]) -> str:
    ports = []
    for port in (svc.get("spec") or {}).get("ports") or []:
        text = str(port.get("port"))
        if port.get("nodePort"):
            text += f":{port['nodePort']}"
        ports.append(f"{text}/{port.get('protocol', 'TCP')}")
    return ",".join(ports) or "<none>"


def _event_object(event: dict[str, Any]) -> str:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _event_last_seen(event: dict[str, Any]) -> str:
    when = (
        event.get("lastTimestamp")
        or event.get("deprecatedLastTimestamp")
        or event.get("eventTime")
        or _meta(event).get("creationTimestamp")
    )
    return age(when)


def _get(*path: str, default: Any = None) -> Callable[[dict[str, Any]], Any]:
    def get(obj: dict[str, Any]) -> Any:
        node: Any = obj
        for part in path:
            if not isinstance(node, dict):
                return default
            node = node.get(part)
        return default if node is None else node

    return get


BUILTIN_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [
        NAME,
        ("Ready", "string", "", 0, _pod_ready),
        ("Status", "string", "", 0, _pod_status),
        ("Restarts", "string", "", 0, _pod_restarts),
        AGE,
        ("IP", "string", "", 1, _get("status", "podIP", default="<none>")),
        ("Node", "string", "", 1, _get("spec", "nodeName", default="<none>")),
        ("Nominated Node", "string", "", 1, _get("status", "nominatedNodeName", default="<none>")),
        ("Readiness Gates", "string", "", 1, lambda p: "<none>"),
    ],
    ("", "nodes"): [
        NAME,
        ("Status", "string", "", 0, _node_status),
        ("Roles", "string", "", 0, _node_roles),
        AGE,
        ("Version", "string", "", 0, _get("status", "nodeInfo", "kubeletVersion", default="")),
        ("Internal-IP", "string", "", 1, _node_address("InternalIP")),
        ("External-IP", "string", "", 1, _node_address("ExternalIP")),
    ],
    ("", "namespaces"): [NAME, ("Status", "string", "", 0, _get("status", "phase", default="")), AGE],
    ("", "events"): [
        ("Last Seen", "string", "", 0, _event_last_seen),
        ("Type", "string", "", 0, _get("type", default="")),
        ("Reason", "string", "", 0, _get("reason", default="")),
        ("Object", "string", "", 0, _event_object),
        # events.k8s.io/v1 shows the same events with `note` for `message`.
        ("Message", "string", "", 0, lambda e: e.get("message") or e.get("note") or ""),
    ],
    ("", "services"): [
        NAME,
        ("Type", "string", "", 0, _get("spec", "type", default="ClusterIP")),
        ("Cluster-IP", "string", "", 0, _get("spec", "clusterIP", default="<none>")),
        ("External-IP", "string", "", 0, lambda s: "<none>"),
        ("Port(s)", "string", "", 0, _service_ports),
        AGE,
    ],
    ("", "persistentvolumeclaims"): [
        NAME,
        ("Status", "string", "", 0, _get("status", "phase", default="")),
        ("Volume", "string", "", 0, _get("spec", "volumeName", default="")),
        ("Capacity", "string", "", 0, _get("status", "capacity", "storage", default="")),
        (
            "Access Modes",
            "string",
            "",
            0,
            lambda o: ",".join((o.get("status") or {}).get("accessModes") or []),
        ),
        ("StorageClass", "string", "", 0, _get("spec", "storageClassName", default="<unset>")),
        AGE,
    ],
    ("", "configmaps"): [
        NAME,
        ("Data", "integer", "", 0, lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
        AGE,
    ],
    ("", "secrets"): [
        NAME,
        ("Type", "string", "", 0, _get("type", default="Opaque")),
        ("Data", "integer", "", 0, lambda o: len(o.get("data") or {})),
        AGE,
    ],
    ("apps", "deployments"): [
        NAME,
        (
            "Ready",
            "string",
            "",
            0,
            lambda d: (
                f"{_get('status', 'readyReplicas', default=0)(d)}/{_get('spec', 'replicas', default=1)(d)}"
            ),
        ),
        ("Up-to-date", "integer", "", 0, _get("status", "updatedReplicas", default=0)),
        ("Available", "integer", "", 0, _get("status", "availableReplicas", default=0)),
        AGE,
    ],
    ("apiextensions.k8s.io", "customresourcedefinitions"): [
        NAME,
        ("Created At", "date", "", 0, lambda o: _meta(o).get("creationTimestamp", "")),
    ],
}


def _format_cell(value: Any, column_type: str) -> Any:
    if column_type == "date":
        return age(value) if isinstance(value, str) else value
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return value


def _crd_columns(rt: ResourceType) -> list[Column]:
    assert rt.crd is not None
    if not rt.crd.printer_columns:
        return [NAME, AGE]
    columns: list[Column] = [NAME]
    for spec in rt.crd.printer_columns:
        path = spec.get("jsonPath", "")
        column_type = spec.get("type", "string")

        def getter(obj: dict[str, Any], path: str = path, column_type: str = column_type) -> Any:
            found = evaluate(obj, path)
            if not found:
                return None
            if len(found) == 1:
                return _format_cell(found[0], column_type)
            return ",".join(str(_format_cell(v, column_type)) for v in found)

        columns.append(
            (spec["name"], column_type, spec.get("format", ""), int(spec.get("priority", 0)), getter)
        )
    return columns


def columns_for(rt: ResourceType) -> list[Column]:
    if rt.crd is not None:
        return _crd_columns(rt)
    return BUILTIN_COLUMNS.get(rt.storage_key, [NAME, AGE])


def table(
    rt: ResourceType,
    objects: list[dict[str, Any]],
    include_object: str = "Object",
    with_columns: bool = True,
    list_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    columns = columns_for(rt)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [column[4](obj) for column in columns]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append(row)
    result: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta or {},
        "rows": rows,
    }
    if with_columns:
        result["columnDefinitions"] = [
            {
                "name": name,
                "type": "string" if ctype == "date" else ctype,
                "format": fmt,
                "description": "",
                "priority": prio,
            }
            for name, ctype, fmt, prio, _ in columns
        ]
    return result
