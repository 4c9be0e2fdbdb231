"""OpenAPI documents, enough for kubectl's validation and ``kubectl explain`` of custom resources.

kubectl 1.32 decides where to validate by looking, in ``/openapi/v3/<group-version>``, for the
``fieldValidation`` query parameter on the PATCH operation of the kind: it is advertised for every
served kind, so kubectl sends ``fieldValidation=Strict`` and the server validates (unknown fields of
custom objects are a 400 "strict decoding error", schema violations a 422). ``/openapi/v2`` is an
empty protobuf document: client-side validation then finds no schema and leaves the work to the
server. Custom resources' schemas are published under ``components.schemas``; built-in kinds have
paths but no schemas (kubectl falls back to its compiled-in types for strategic merge patches).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import Registry, ResourceType

# The response type a real server sends (the request asks for the deprecated "...v2@v1.0+protobuf",
# which is not a valid media type for strict parsers such as Go's mime package).
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _schema_name(rt: ResourceType) -> str:
    reversed_group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{reversed_group}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType) -> dict[str, str]:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _operation(rt: ResourceType, action: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "operationId": f"{action}{rt.kind}",
        "parameters": params,
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt),
    }


def _query(name: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": "string"}}


def group_version_document(registry: Registry, group: str, version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    write_params = [_query("dryRun"), _query("fieldManager"), _query("fieldValidation")]
    for rt in registry.resources(group, version):
        prefix = "/" + _gv_path(group, version)
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
        patch_op = _operation(rt, "patch", [*write_params, _query("force")])
        patch_op["requestBody"] = {
            "content": {
                "application/json-patch+json": {"schema": {"type": "object"}},
                "application/merge-patch+json": {"schema": {"type": "object"}},
                "application/apply-patch+yaml": {"schema": {"type": "object"}},
            }
        }
        paths[base] = {"post": _operation(rt, "post", write_params), "get": _operation(rt, "list", [])}
        paths[f"{base}/{{name}}"] = {
            "get": _operation(rt, "get", []),
            "put": _operation(rt, "put", write_params),
            "patch": patch_op,
            "delete": _operation(rt, "delete", [_query("dryRun")]),
        }
        if rt.crd is not None and rt.crd.schema is not None:
            schema = json.loads(json.dumps(rt.crd.schema))
            schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
            schemas[_schema_name(rt)] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def index_document(registry: Registry) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for group, versions in registry.groups().items():
        for version in versions:
            doc = json.dumps(group_version_document(registry, group, version), sort_keys=True)
            digest = hashlib.sha512(doc.encode()).hexdigest()[:32].upper()
            path = _gv_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
