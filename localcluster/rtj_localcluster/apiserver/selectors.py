"""Label selectors and field selectors as list and watch requests carry them.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, joined
by commas. Field selectors: ``path=value``, ``path==value``, ``path!=value`` over the fields a kind
supports (:data:`FIELD_PATHS`); an unsupported field is a 400 as on a real API server.
Used by ``core`` for lists and by ``store`` watchers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_LABEL_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*({_LABEL_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> Predicate | None:
    if not text or not text.strip():
        return None
    checks: list[tuple[str, str, frozenset[str]]] = []  # (operator, key, values)
    for term in _split_terms(text):
        m = _SET_RE.match(term)
        if m:
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            checks.append((m.group(3), m.group(1), values))
            continue
        for op in ("!=", "==", "="):
            if op in term:
                key, _, value = term.partition(op)
                key, value = key.strip(), value.strip()
                if not re.fullmatch(_LABEL_KEY, key):
                    raise bad_request(f"unable to parse requirement: invalid label key {key!r}")
                checks.append(("notin" if op == "!=" else "in", key, frozenset({value})))
                break
        else:
            negate = term.startswith("!")
            key = term[1:].strip() if negate else term
            if not re.fullmatch(_LABEL_KEY, key):
                raise bad_request(f"unable to parse requirement: invalid label key {key!r}")
            checks.append(("!" if negate else "exists", key, frozenset()))

    def matches(labels: dict[str, str], op: str, key: str, values: frozenset[str]) -> bool:
        if op == "in":
            return labels.get(key) in values
        if op == "notin":
            return labels.get(key) not in values
        if op == "exists":
            return key in labels
        return key not in labels

    def predicate(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(matches(labels, op, key, values) for op, key, values in checks)

    return predicate


# Fields a kind can be selected on, beyond metadata.name and metadata.namespace (valid for all).
FIELD_PATHS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    ("", "events"): frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "secrets"): frozenset({"type"}),
    ("", "persistentvolumeclaims"): frozenset({"spec.volumeName"}),
    ("", "persistentvolumes"): frozenset({"spec.storageClassName"}),
    ("apps", "replicasets"): frozenset({"status.replicas"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
}


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string form of a selectable field (absent fields read as the empty string)."""
    if path == "source":  # events: the component that reported it
        src = obj.get("source") or {}
        return str(src.get("component", ""))
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_field_selector(
    text: str | None, storage_key: tuple[str, str], extra_fields: tuple[str, ...] = ()
) -> Predicate | None:
    if not text or not text.strip():
        return None
    allowed = FIELD_PATHS.get(storage_key, frozenset()) | {"metadata.name", "metadata.namespace"}
    allowed |= {f.lstrip(".") for f in extra_fields}
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(text):
        for op in ("!=", "==", "="):
            if op in term:
                path, _, value = term.partition(op)
                path = path.strip()
                if path not in allowed:
                    raise bad_request(
                        f'"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"'
                        + "".join(
                            f', "{p}"' for p in sorted(allowed - {"metadata.name", "metadata.namespace"})
                        )
                    )
                checks.append((path, op == "!=", value.strip()))
                break
        else:
            raise bad_request(f"invalid field selector: {term!r}")

    def predicate(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, path) == value) != negate for path, negate, value in checks)

    return predicate
