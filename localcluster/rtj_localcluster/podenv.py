"""Pure pieces of the process kubelet: mount-path rewriting, env resolution, `$(VAR)` expansion,
pod phase and conditions.

``rtj_localcluster.kubelet`` does the I/O (directories, processes, API calls) and calls these; they
are kept free of I/O so that their rules are tested directly.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

Mounts = Sequence[tuple[str, str]]


def normalise_mounts(mounts: Mapping[str, str]) -> list[tuple[str, str]]:
    """(mountPath, real directory) pairs, longest mount path first so nested mounts win."""
    pairs = [(m.rstrip("/"), real.rstrip("/") or "/") for m, real in mounts.items() if m.rstrip("/")]
    return sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)


def rewrite_path(value: str, mounts: Mounts, image_file: Callable[[str, str], bool] | None = None) -> str:
    """``value`` with a leading mount path replaced by its real directory (path-boundary aware):
    with ``/ckpt`` mounted, ``/ckpt`` and ``/ckpt/a`` are rewritten, ``/ckpt2`` is not.

    ``image_file(value, rewritten)`` keeps a path below a mount that names a file of the image
    instead: on the local cluster the image is the host's own files, and a checkout or environment
    under /tmp (where the pod's scratch volume is mounted) must not be hidden by it."""
    for mount, real in mounts:
        if value == mount:
            return real
        if value.startswith(mount + "/"):
            rewritten = real + value[len(mount) :]
            return value if image_file is not None and image_file(value, rewritten) else rewritten
    return value


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_references(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, others stay."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _REFERENCE.sub(replace, value)


def _bracket_key(path: str, prefix: str) -> str | None:
    match = re.fullmatch(re.escape(prefix) + r"\['([^']*)'\]", path)
    return match.group(1) if match else None


def field_ref_value(path: str, pod: Mapping[str, Any], *, pod_ip: str, host_ip: str) -> str:
    """The value of a downward-API ``fieldRef.fieldPath`` for ``pod``."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    label = _bracket_key(path, "metadata.labels")
    if label is not None:
        return str((meta.get("labels") or {}).get(label, ""))
    annotation = _bracket_key(path, "metadata.annotations")
    if annotation is not None:
        return str((meta.get("annotations") or {}).get(annotation, ""))
    raise ValueError(f"unsupported fieldRef {path!r}")


def resource_field_value(
    ref: Mapping[str, Any], container: Mapping[str, Any], node_allocatable: Mapping[str, str]
) -> str:
    """``resourceFieldRef``: the container's limit (or the node's allocatable) / request, in the divisor."""
    from rtj_contract.quantity import parse_quantity

    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    section = resources.get("limits" if kind == "limits" else "requests") or {}
    raw = section.get(name)
    if raw is None:
        raw = node_allocatable.get(name, "0") if kind == "limits" else "0"
    value = parse_quantity(raw) / parse_quantity(ref.get("divisor") or "1")
    # Kubernetes rounds up to a whole number of divisors.
    whole = -(-value.numerator // value.denominator)
    return str(whole)


def resolve_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    *,
    base: Mapping[str, str],
    pod_ip: str,
    host_ip: str,
    configmaps: Mapping[str, Mapping[str, Any]],
    secrets: Mapping[str, Mapping[str, Any]],
    node_allocatable: Mapping[str, str],
    mounts: Mounts,
) -> dict[str, str]:
    """The process environment: ``base``, then envFrom, then env (with ``$(VAR)`` expansion),
    then every value that starts with a mount path rewritten to its real directory.

    ``configmaps``/``secrets`` map names to objects; a missing one raises KeyError unless optional.
    """
    env = dict(base)
    declared: dict[str, str] = {}

    def source_data(kind: str, name: str, optional: bool) -> Mapping[str, str]:
        store = configmaps if kind == "configMap" else secrets
        if name not in store:
            if optional:
                return {}
            raise KeyError(f"{kind} {name!r} not found")
        obj = store[name]
        data = dict(obj.get("data") or {})
        if kind == "secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            data.update(obj.get("stringData") or {})
        else:
            data.update({k: base64.b64decode(v).decode() for k, v in (obj.get("binaryData") or {}).items()})
        return data

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind in ("configMap", "secret"):
            ref = source.get(f"{kind}Ref")
            if ref:
                for key, value in source_data(kind, ref.get("name", ""), bool(ref.get("optional"))).items():
                    declared[prefix + key] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            declared[name] = expand_references(str(item.get("value", "")), {**env, **declared})
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            declared[name] = field_ref_value(
                source["fieldRef"]["fieldPath"], pod, pod_ip=pod_ip, host_ip=host_ip
            )
        elif "resourceFieldRef" in source:
            declared[name] = resource_field_value(source["resourceFieldRef"], container, node_allocatable)
        else:
            for kind in ("configMap", "secret"):
                ref = source.get(f"{kind}KeyRef")
                if ref:
                    data = source_data(kind, ref.get("name", ""), bool(ref.get("optional")))
                    if ref["key"] in data:
                        declared[name] = data[ref["key"]]
                    elif not ref.get("optional"):
                        raise KeyError(f"key {ref['key']!r} not in {kind} {ref.get('name')!r}")
    env.update({name: rewrite_path(value, mounts) for name, value in declared.items()})
    return env


def container_argv(
    container: Mapping[str, Any],
    env: Mapping[str, str],
    mounts: Mounts,
    image_file: Callable[[str, str], bool] | None = None,
) -> list[str]:
    """command + args with mount paths rewritten (but the image's files: `rewrite_path`) and
    ``$(VAR)`` expanded; no image entrypoint exists.

    Each argument is rewritten before the expansion: `env` already holds rewritten paths, and a
    second rewrite would map a real directory that happens to lie under a mount path (the pod's
    scratch volume is mounted at /tmp, where local clusters keep their state) once more."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv:
        raise ValueError("container has no command: the local kubelet cannot run an image's entrypoint")
    return [expand_references(rewrite_path(str(a), mounts, image_file), env) for a in argv]


# ---------------------------------------------------------------------------------------------
# Pod phase and conditions from container states
# ---------------------------------------------------------------------------------------------


def pod_phase(containers: Sequence[tuple[bool, int | None, bool]]) -> str:
    """The pod phase from (started once, exit code or None while running, will restart) per container.

    Pending until every container started once; Running while one runs or will be restarted by the
    restart policy; then Succeeded when every container exited 0, else Failed.
    """
    if not containers or not all(started for started, _, _ in containers):
        return "Pending"
    if any(code is None or again for _, code, again in containers):
        return "Running"
    return "Succeeded" if all(code == 0 for _, code, _ in containers) else "Failed"


def condition(kind: str, status: bool, now: str, reason: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now,
    }
    if reason:
        result["reason"] = reason
    return result


def merge_conditions(
    previous: Sequence[Mapping[str, Any]], wanted: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``wanted``, keeping lastTransitionTime where the status did not change, and keeping
    conditions owned by others (e.g. DisruptionTarget)."""
    old = {c.get("type"): c for c in previous}
    result = []
    for item in wanted:
        before = old.get(item["type"])
        if before is not None and before.get("status") == item["status"] and before.get("lastTransitionTime"):
            result.append({**item, "lastTransitionTime": before["lastTransitionTime"]})
        else:
            result.append(item)
    mine = {c["type"] for c in wanted}
    result.extend(dict(c) for c in previous if c.get("type") not in mine)
    return result
