"""docs/localcluster.md stays true: its table of served resources equals the API server's discovery
documents, and the limits it states hold (legacy discovery only, 415 for strategic merge patches of
custom resources and for unknown protobuf bodies, unsupported CEL rules accepted with a warning and
not evaluated); plus spot checks at the HTTP level of what it says is implemented (legacy watch
paths, YAML bodies, Tables, metadata-only lists, Status errors)."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rtj_localcluster.apiserver import ApiServer

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "localcluster.md"


class Http:
    def __init__(self, server: ApiServer) -> None:
        self.base = server.url
        self.context = ssl.create_default_context(cafile=str(server.ca_path))

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], Any]:
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=60) as response:
                return response.status, dict(response.headers), json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            with error:
                return error.code, dict(error.headers), json.loads(error.read() or b"null")

    def get(self, path: str, headers: dict[str, str] | None = None) -> Any:
        status, _, body = self.request("GET", path, headers=headers)
        assert status == 200, (path, body)
        return body


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    server = ApiServer(tmp_path_factory.mktemp("api"))
    server.start()
    yield Http(server)
    server.stop()


def _documented() -> set[tuple[str, str, str, str, str]]:
    text = DOC.read_text()
    section = text[text.index("### Served resources") : text.index("### What it implements")]
    rows = set()
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|\s*(\w+)\s*\|\s*(\w+)\s*\|\s*([^|]+)\|", line)
        if m:
            subresources = ", ".join(
                sorted(s.strip() for s in m.group(5).split(",") if s.strip() not in ("-", ""))
            )
            rows.add((m.group(1), m.group(2), m.group(3), m.group(4), subresources))
    return rows


def _discovered(http: Http) -> set[tuple[str, str, str, str, str]]:
    lists = [http.get("/api/v1")]
    for group in http.get("/apis")["groups"]:
        for version in group["versions"]:
            lists.append(http.get(f"/apis/{version['groupVersion']}"))
    rows = set()
    for resource_list in lists:
        resources = resource_list["resources"]
        for r in resources:
            if "/" in r["name"]:
                continue
            subs = sorted(
                s["name"].split("/", 1)[1] for s in resources if s["name"].startswith(r["name"] + "/")
            )
            scope = "Namespaced" if r["namespaced"] else "Cluster"
            rows.add((resource_list["groupVersion"], r["name"], r["kind"], scope, ", ".join(subs)))
    return rows


def test_served_resources_table_matches_discovery(http: Http) -> None:
    documented = _documented()
    assert len(documented) >= 20
    assert documented == _discovered(http)
    for namespace in ("default", "kube-system", "kube-public", "kube-node-lease"):
        http.get(f"/api/v1/namespaces/{namespace}")
    assert http.get("/version")["minor"] == "32"


def test_stated_limits_hold(http: Http) -> None:
    text = " ".join(DOC.read_text().split())  # independent of line wrapping
    # Aggregated discovery is not served: the legacy form answers such a request.
    assert "Aggregated discovery (`apidiscovery.k8s.io/v2`)" in text
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    assert http.get("/apis", headers={"Accept": accept})["kind"] == "APIGroupList"

    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.docs.example.com"},
        "spec": {
            "group": "docs.example.com",
            "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-validations": [
                                        {"rule": "duration(self.d) > duration('1s')"}
                                    ],
                                    "properties": {"d": {"type": "string"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    # An unsupported CEL rule: the CRD is accepted with a warning, the rule is not evaluated.
    assert "accepted with a Warning header, and the rule is not evaluated" in text
    status, headers, _ = http.request(
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        json.dumps(crd).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 201 and "duration(self.d)" in headers.get("Warning", "")
    thing = {
        "apiVersion": "docs.example.com/v1",
        "kind": "Thing",
        "metadata": {"name": "t"},
        "spec": {"d": "0s"},
    }
    status, _, _ = http.request(
        "POST",
        "/apis/docs.example.com/v1/namespaces/default/things",
        json.dumps(thing).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 201

    assert "Strategic merge patch on a custom resource is a 415" in text
    status, _, body = http.request(
        "PATCH",
        "/apis/docs.example.com/v1/namespaces/default/things/t",
        b'{"spec":{"d":"1s"}}',
        {"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert status == 415 and body["reason"] == "UnsupportedMediaType"

    assert "protobuf request bodies of other kinds (415" in text
    envelope = b"k8s\x00" + bytes([0x0A, 0x0B, 0x0A, 0x02]) + b"v1" + bytes([0x12, 0x05]) + b"Event"
    status, _, body = http.request(
        "POST",
        "/api/v1/namespaces/default/events",
        envelope,
        {"Content-Type": "application/vnd.kubernetes.protobuf"},
    )
    assert status == 415, body


def test_raw_http_semantics(http: Http) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "raw"}, "data": {"a": "1"}}
    status, _, created = http.request(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        json.dumps(cm).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 201
    # YAML bodies are accepted too.
    status, _, _ = http.request(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-yaml}\n",
        {"Content-Type": "application/yaml"},
    )
    assert status == 201
    # The legacy /watch/ path streams the same events (here: the objects that exist, then a timeout).
    req = urllib.request.Request(
        http.base + "/api/v1/watch/namespaces/default/configmaps?timeoutSeconds=1", method="GET"
    )
    with urllib.request.urlopen(req, context=http.context, timeout=60) as response:
        events = [json.loads(line) for line in response.read().splitlines()]
    assert ("ADDED", "raw") in [(e["type"], e["object"]["metadata"]["name"]) for e in events]

    table = http.get(
        "/api/v1/namespaces/default/configmaps/raw",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    assert table["kind"] == "Table" and [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Data",
        "Age",
    ]
    assert table["rows"][0]["cells"][:2] == ["raw", 1]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    meta_list = http.get(
        "/api/v1/namespaces/default/configmaps",
        headers={"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
    )
    assert meta_list["kind"] == "PartialObjectMetadataList" and "data" not in meta_list["items"][0]

    expectations = [
        ("POST", "/api/v1/namespaces/default/configmaps", b"{not json", 400, "BadRequest"),
        ("GET", "/api/v1/namespaces/default/nothings", None, 404, "NotFound"),
        ("PUT", "/api/v1/namespaces/default/configmaps", b"{}", 405, "MethodNotAllowed"),
        ("POST", "/api/v1/namespaces/default/configmaps", json.dumps(cm).encode(), 409, "AlreadyExists"),
        ("DELETE", "/api/v1/namespaces/default/configmaps/missing", None, 404, "NotFound"),
    ]
    for method, path, body, code, reason in expectations:
        status, _, answer = http.request(method, path, body, {"Content-Type": "application/json"})
        assert (status, answer["reason"], answer["code"], answer["kind"]) == (code, reason, code, "Status"), (
            path
        )
    stale = {**created, "data": {"a": "2"}}
    http.request(
        "PUT",
        "/api/v1/namespaces/default/configmaps/raw",
        json.dumps({**created, "data": {"a": "3"}}).encode(),
        {"Content-Type": "application/json"},
    )
    status, _, answer = http.request(
        "PUT",
        "/api/v1/namespaces/default/configmaps/raw",
        json.dumps(stale).encode(),
        {"Content-Type": "application/json"},
    )
    assert (status, answer["reason"]) == (409, "Conflict")
