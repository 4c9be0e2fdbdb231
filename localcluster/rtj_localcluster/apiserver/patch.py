"""PATCH semantics: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and an
approximation of server-side apply.

Strategic merge patch knows the patch merge keys of the built-in kinds that matter to clients
(containers and env by name, volumeMounts by mountPath, conditions by type, finalizers as a set...)
and the ``$patch``, ``$retainKeys``, ``$deleteFromPrimitiveList`` and ``$setElementOrder``
directives kubectl sends. Server-side apply merges the applied configuration like a strategic merge
(atomic lists for custom resources, as their default list type is) and removes the fields the same
field manager applied before and no longer applies; ``managedFields`` are not tracked.
``core`` calls these on stored objects (never mutating them: every function returns a new value).
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, bad_request

# field name -> merge key, for lists merged element-wise. ``None``: a set of primitives (union).
_MERGE_KEYS: dict[str, str | None] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "finalizers": None,
    "ownerReferences": "uid",
    "addresses": "type",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "resourceClaims": "name",
}


def _merge_key(path: tuple[str, ...], field: str) -> tuple[bool, str | None]:
    """(merge this list?, its key) for the list ``field`` found at ``path``."""
    if field == "ports":
        # Service ports merge by port, container ports by containerPort.
        return True, ("containerPort" if "containers" in path or "initContainers" in path else "port")
    if field in _MERGE_KEYS:
        if field == "finalizers" and path != ("metadata",):
            return False, None
        return True, _MERGE_KEYS[field]
    return False, None


def json_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
            continue
        if isinstance(value, list):
            merge, merge_key = _merge_key(path, key)
            if merge:
                result[key] = _merge_list(result.get(key), value, merge_key, (*path, key))
                continue
            result[key] = [copy.deepcopy(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
            continue
        if isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, (*path, key))
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
            continue
        result[key] = value
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(current: Any, patch: list[Any], key: str | None, path: tuple[str, ...]) -> list[Any]:
    items: list[Any] = copy.deepcopy(current) if isinstance(current, list) else []
    if key is None:  # a set of primitives
        for value in patch:
            if value not in items:
                items.append(copy.deepcopy(value))
        return items
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            items.append(copy.deepcopy(element))
            continue
        index = next(
            (i for i, it in enumerate(items) if isinstance(it, dict) and it.get(key) == element[key]), None
        )
        if element.get("$patch") == "delete":
            if index is not None:
                del items[index]
            continue
        if index is None:
            items.append(strategic_merge_patch({}, element, path))
        else:
            items[index] = strategic_merge_patch(items[index], element, path)
    return items


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request: {op} operation does not apply: doc is missing path",
            )
    return node, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(422, "Invalid", "the server rejected our request: doc is missing path")
    return node


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise bad_request(f"invalid json patch operation: {operation!r}")
        op = operation["op"]
        parts = _pointer(operation["path"])
        if op == "test":
            if _get(doc, parts) != operation.get("value"):
                raise ApiError(422, "Invalid", f"testing value {operation['path']} failed")
            continue
        if op in ("move", "copy"):
            source = _pointer(operation.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if op == "move":
                doc = _remove(doc, source)
            doc = _add(doc, parts, value)
            continue
        if op == "add":
            doc = _add(doc, parts, copy.deepcopy(operation.get("value")))
        elif op == "remove":
            doc = _remove(doc, parts)
        elif op == "replace":
            _get(doc, parts)
            if not parts:
                doc = copy.deepcopy(operation.get("value"))
                continue
            parent, last = _resolve(doc, parts, op)
            if isinstance(parent, list):
                parent[int(last)] = copy.deepcopy(operation.get("value"))
            else:
                parent[last] = copy.deepcopy(operation.get("value"))
        else:
            raise bad_request(f"unexpected json patch operation {op!r}")
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _resolve(doc, parts, "add")
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise ApiError(422, "Invalid", f"add operation: index {last} out of bounds")
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError(422, "Invalid", "add operation does not apply: parent is not a container")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    _get(doc, parts)
    parent, last = _resolve(doc, parts, "remove")
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return doc


def apply_merge(
    current: Any, config: Any, previous: Any, atomic_lists: bool, path: tuple[str, ...] = ()
) -> Any:
    """Server-side apply of ``config`` onto ``current``; ``previous`` is what the same manager applied
    last time (fields it held then and drops now are removed)."""
    if not isinstance(config, dict):
        return copy.deepcopy(config)
    result: dict[str, Any] = copy.deepcopy(current) if isinstance(current, dict) else {}
    if isinstance(previous, dict):
        for key in previous:
            if key not in config and (*path, key) not in _NEVER_REMOVED:
                result.pop(key, None)
    for key, value in config.items():
        prev = previous.get(key) if isinstance(previous, dict) else None
        if isinstance(value, dict):
            result[key] = apply_merge(result.get(key), value, prev, atomic_lists, (*path, key))
        elif isinstance(value, list) and not atomic_lists:
            merge, merge_key = _merge_key(path, key)
            if merge:
                merged = _merge_list(result.get(key), value, merge_key, (*path, key))
                if merge_key is not None and isinstance(prev, list):
                    wanted = {v.get(merge_key) for v in value if isinstance(v, dict)}
                    dropped = {p.get(merge_key) for p in prev if isinstance(p, dict)} - wanted
                    merged = [m for m in merged if not (isinstance(m, dict) and m.get(merge_key) in dropped)]
                result[key] = merged
            else:
                result[key] = copy.deepcopy(value)
        else:
            result[key] = copy.deepcopy(value)
    return result


_NEVER_REMOVED = {("metadata",), ("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}
