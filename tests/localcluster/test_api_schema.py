"""Custom-object schemas on the embedded API server: 422 Invalid naming each field, defaults,
pruning, CEL rules (transition rules included), the status subresource; and the pure pieces
behind them (CEL subset, printer-column JSONPath, patch semantics)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rtj_localcluster.apiserver import ApiServer
from rtj_localcluster.apiserver.cel import CelError, CelUnsupported, compile_rule
from rtj_localcluster.apiserver.jsonpath import evaluate
from rtj_localcluster.apiserver.patch import apply_merge, json_merge_patch, json_patch, strategic_merge_patch
from rtj_localcluster.apiserver.selectors import parse_label_selector

GROUP, VERSION, PLURAL = "schema.example.com", "v1", "jobs"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["image", "nodes"],
            "x-kubernetes-validations": [
                {"rule": "self.nodes == oldSelf.nodes", "message": "nodes is immutable"},
                {"rule": "!has(self.hard) || self.hard > self.soft", "message": "hard must exceed soft"},
                {"rule": "self.image.startsWith('repo/') && size(self.image) <= 40", "fieldPath": ".image"},
            ],
            "properties": {
                "image": {"type": "string", "pattern": "^[a-z/:0-9.-]+$"},
                "nodes": {"type": "integer", "minimum": 1, "maximum": 64},
                "mode": {"type": "string", "enum": ["Async", "Sync"], "default": "Async"},
                "soft": {"type": "integer", "default": 60},
                "hard": {"type": "integer"},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 5}},
                "checkpoint": {
                    "type": "object",
                    "default": {},
                    "properties": {"keep": {"type": "integer", "default": 3}, "path": {"type": "string"}},
                },
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("api"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def custom(api: ApiServer) -> Iterator[client.CustomObjectsApi]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(api.kubeconfig_path), client_configuration=configuration)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "job", "kind": "Job"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": SCHEMA},
                }
            ],
        },
    }
    with client.ApiClient(configuration) as api_client:
        client.ApiextensionsV1Api(api_client).create_custom_resource_definition(crd)
        yield client.CustomObjectsApi(api_client)


def _job(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def _create(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    return result


def _rejected(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ApiException) as error:
        _create(custom, body)
    assert error.value.status == 422, error.value.body
    status: dict[str, Any] = json.loads(error.value.body)
    assert status["reason"] == "Invalid" and status["kind"] == "Status"
    return status


def _fields(status: dict[str, Any]) -> dict[str, str]:
    return {cause["field"]: cause["reason"] for cause in status["details"]["causes"]}


@pytest.mark.slow
def test_invalid_objects_name_each_field(custom: client.CustomObjectsApi) -> None:
    status = _rejected(custom, _job("bad1", nodes=0, image="repo/x", mode="Fast"))
    assert _fields(status) == {"spec.nodes": "FieldValueInvalid", "spec.mode": "FieldValueNotSupported"}
    assert "greater than or equal to 1" in status["message"]
    assert '"Async", "Sync"' in status["message"]

    assert _fields(_rejected(custom, _job("bad2", image="repo/x"))) == {"spec.nodes": "FieldValueRequired"}
    assert _fields(_rejected(custom, _job("bad3", nodes="two", image="repo/x"))) == {
        "spec.nodes": "FieldValueTypeInvalid"
    }
    assert _fields(_rejected(custom, _job("bad4", nodes=1, image="Repo/X"))) == {
        "spec.image": "FieldValueInvalid"
    }
    assert _fields(_rejected(custom, _job("bad5", nodes=1, image="repo/x", tags=["a", "b", "c"]))) == {
        "spec.tags": "FieldValueTooMany"
    }
    assert _fields(_rejected(custom, _job("bad6", nodes=1, image="repo/x", tags=["toolong"]))) == {
        "spec.tags[0]": "FieldValueTooLong"
    }
    assert _fields(_rejected(custom, _job("bad7", nodes=1, image="repo/x", labels={"a": 1}))) == {
        "spec.labels.a": "FieldValueTypeInvalid"
    }
    # CEL rules: a plain rule on the object and one with a fieldPath.
    cel = _rejected(custom, _job("bad8", nodes=1, image="repo/x", soft=90, hard=30))
    assert _fields(cel) == {"spec": "FieldValueInvalid"} and "hard must exceed soft" in cel["message"]
    assert _fields(_rejected(custom, _job("bad9", nodes=1, image="other/x"))) == {
        "spec.image": "FieldValueInvalid"
    }


@pytest.mark.slow
def test_defaults_and_pruning(custom: client.CustomObjectsApi) -> None:
    body = _job("good", nodes=2, image="repo/trainer:1", unknown="dropped", extra={"anything": {"goes": 1}})
    body["status"] = {"phase": "Done"}
    body["unknownTop"] = 1
    created = _create(custom, body)
    assert created["spec"] == {
        "nodes": 2,
        "image": "repo/trainer:1",
        "mode": "Async",
        "soft": 60,
        "checkpoint": {"keep": 3},
        "extra": {"anything": {"goes": 1}},
    }
    assert "unknownTop" not in created
    assert "status" not in created  # the status subresource owns status


@pytest.mark.slow
def test_transition_rule_and_status_subresource(custom: client.CustomObjectsApi) -> None:
    _create(custom, _job("immutable", nodes=2, image="repo/x"))
    with pytest.raises(ApiException) as error:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "immutable", {"spec": {"nodes": 3}}
        )
    assert error.value.status == 422 and "nodes is immutable" in error.value.body
    changed = custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "immutable", {"spec": {"mode": "Sync"}}
    )
    assert changed["spec"]["mode"] == "Sync" and changed["metadata"]["generation"] == 2

    after = custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "immutable",
        {"status": {"phase": "Running"}, "spec": {"mode": "Async"}},
    )
    assert after["status"] == {"phase": "Running"} and after["spec"]["mode"] == "Sync"
    assert after["metadata"]["generation"] == 2  # status writes do not bump the generation
    replaced = custom.replace_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "immutable", {**after, "status": {"phase": "Ignored"}}
    )
    assert replaced["status"] == {"phase": "Running"}


def test_cel_subset() -> None:
    def run(rule: str, value: Any, old: Any = None) -> Any:
        return compile_rule(rule).evaluate({"self": value, "oldSelf": old})

    assert run("self.a == oldSelf.a", {"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) is True
    assert run("self.a == oldSelf.a", {"a": 1}, {"a": 2}) is False
    assert run("has(self.x) ? self.x > 1 : true", {}) is True
    assert (
        run("size(self.items) <= 2 && self.items.all(i, i.startsWith('a'))", {"items": ["ab", "ac"]}) is True
    )
    assert run("self.items.exists(i, i == 'z') || self.n % 2 == 0", {"items": ["a"], "n": 4}) is True
    assert run("self.items.map(i, i * 2) == [2, 4]", {"items": [1, 2]}) is True
    assert run("self.name.matches('^[a-z]+$') && 'k' in self.m", {"name": "abc", "m": {"k": 1}}) is True
    assert run("self.x / 2 == 2 && -self.x < 0 && double(self.x) > 3.5", {"x": 5}) is True
    assert compile_rule("self.a == oldSelf.a").uses_old_self
    assert not compile_rule("self.a == 1").uses_old_self
    with pytest.raises(CelError):
        run("self.missing == 1", {})
    with pytest.raises(CelError):
        run("self.a > 'x'", {"a": 1})
    for unsupported in ("duration(self.t) > duration('1s')", "self.?x.orValue(1) == 1", "type(self) == int"):
        with pytest.raises(CelUnsupported):
            compile_rule(unsupported)


def test_printer_column_jsonpath() -> None:
    obj = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Failed", "status": "False"}],
            "workers": {"readyText": "2/2"},
        },
        "metadata": {"labels": {"a.b/c": "x"}},
        "spec": {"items": [1, 2, 3]},
    }
    assert evaluate(obj, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert evaluate(obj, ".status.conditions[?(@.status!='True')].type") == ["Failed"]
    assert evaluate(obj, ".status.workers.readyText") == ["2/2"]
    assert evaluate(obj, ".metadata.labels['a.b/c']") == ["x"]
    assert evaluate(obj, "{.spec.items[-1]}") == [3]
    assert evaluate(obj, ".spec.items[*]") == [1, 2, 3]
    assert evaluate(obj, ".spec.items[0:2]") == [1, 2]
    assert evaluate(obj, ".status.missing.field") == []


def test_patch_semantics() -> None:
    pod = {
        "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "i:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                },
                {"name": "side", "image": "s:1"},
            ],
            "tolerations": [{"key": "k"}],
        },
    }
    patched = strategic_merge_patch(
        pod,
        {
            "metadata": {"finalizers": ["b"], "labels": {"x": None}},
            "spec": {
                "containers": [
                    {"name": "main", "env": [{"name": "B", "value": "3"}, {"name": "A", "$patch": "delete"}]},
                    {"name": "new", "image": "n:1"},
                ],
                "tolerations": [{"key": "other"}],
                "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}, {"name": "new"}],
            },
        },
    )
    assert patched["metadata"] == {"finalizers": ["a", "b"], "labels": {}}
    assert [c["name"] for c in patched["spec"]["containers"]] == ["main", "side", "new"]
    assert patched["spec"]["containers"][0]["env"] == [{"name": "B", "value": "3"}]
    assert patched["spec"]["tolerations"] == [{"key": "other"}]  # no merge key: replaced
    assert pod["spec"]["containers"][0]["env"][0] == {"name": "A", "value": "1"}  # input untouched

    assert json_merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {
        "a": {"c": 2},
        "l": [2],
    }
    doc = json_patch(
        {"a": [1, 2], "b": {"c": 1}},
        [
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "remove", "path": "/a/0"},
            {"op": "replace", "path": "/b/c", "value": 2},
            {"op": "copy", "from": "/b", "path": "/d"},
            {"op": "test", "path": "/d/c", "value": 2},
        ],
    )
    assert doc == {"a": [2, 3], "b": {"c": 2}, "d": {"c": 2}}

    # Server-side apply: a field the same manager applied before and drops now is removed.
    current = {"spec": {"a": 1, "b": 2, "c": 3}}
    assert apply_merge(current, {"spec": {"a": 5}}, {"spec": {"a": 1, "b": 2}}, atomic_lists=True) == {
        "spec": {"a": 5, "c": 3}
    }


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab", max_size=2),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text("abc", max_size=2), children, max_size=3)
    ),
    max_leaves=10,
)
_json_objects = st.dictionaries(st.text("abc", max_size=2), _json_values, max_size=4)


@settings(max_examples=200, deadline=None)
@given(_json_objects, _json_objects)
def test_merge_patch_is_idempotent_and_pure(target: dict[str, Any], patch: dict[str, Any]) -> None:
    before = json.dumps(target, sort_keys=True)
    once = json_merge_patch(target, patch)
    assert json_merge_patch(once, patch) == once  # RFC 7386: applying a patch twice changes nothing more
    assert json.dumps(target, sort_keys=True) == before
    # Without nulls or nested objects in the patch, every patched key ends up with the patch's value.
    for key, value in patch.items():
        if value is not None and not isinstance(value, dict):
            assert once[key] == value
        if value is None:
            assert key not in once


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["app", "tier", "zone"]), st.sampled_from(["a", "b", "c"]), max_size=3),
    st.sampled_from(["app", "tier", "zone"]),
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3),
)
def test_label_selector_operators_agree(labels: dict[str, str], key: str, values: list[str]) -> None:
    obj = {"metadata": {"labels": labels}}

    def match(text: str) -> bool:
        predicate = parse_label_selector(text)
        assert predicate is not None
        return predicate(obj)

    joined = ",".join(values)
    assert match(f"{key} in ({joined})") == (labels.get(key) in values)
    assert match(f"{key} notin ({joined})") == (not match(f"{key} in ({joined})"))
    assert match(f"{key}={values[0]}") == match(f"{key} in ({values[0]})") == match(f"{key}=={values[0]}")
    assert match(f"{key}!={values[0]}") == (not match(f"{key}={values[0]}"))
    assert match(key) == (key in labels) == (not match(f"!{key}"))
    assert match(f"{key},{key} in ({joined})") == (match(key) and match(f"{key} in ({joined})"))
