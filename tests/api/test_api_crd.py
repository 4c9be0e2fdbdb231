"""The generated CRD: equal to crds/, structural, valid for Kubernetes 1.32, with the promised rules."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from crd_tools import CRD_FILE, cel_errors_as_written, crd_from_file, openapi_schema
from rtj_operator import api, constants, crd_cli
from rtj_operator.api.schema import model_type
from rtj_operator.validation import structural_problems

# Nothing in the spec is kept as given but ft_launcher's own settings (NVRx's FaultToleranceConfig, which
# changes with its releases; the operator checks its keys): every embedded Kubernetes type is modelled, so
# the API server prunes (or, with strict field validation, refuses) what the operator would not understand.
PRESERVE_UNKNOWN_ALLOWED: tuple[str, ...] = ("spec.faultTolerance.ftLauncher.config",)


def test_crds_file_equals_the_generated_crd_byte_for_byte() -> None:
    assert CRD_FILE.read_text(encoding="utf-8") == api.crd_yaml(), "run `make crds` to regenerate crds/"


def test_rtj_crd_prints_the_crds_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert crd_cli.main([]) == 0
    assert capsys.readouterr().out == CRD_FILE.read_text(encoding="utf-8")


def test_the_crd_schema_is_structural() -> None:
    assert structural_problems(openapi_schema(), preserve_unknown_allowed=PRESERVE_UNKNOWN_ALLOWED) == []


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (
            lambda s: s["properties"]["spec"]["properties"]["nodes"].pop("type"),
            "spec.nodes: missing or unknown type",
        ),
        (
            lambda s: s["properties"]["spec"]["properties"].__setitem__(
                "x", {"$ref": "#/a", "description": "x"}
            ),
            "spec.x: $ref is not allowed",
        ),
        (
            lambda s: s["properties"]["spec"]["properties"]["image"].__setitem__(
                "anyOf", [{"type": "string"}, {"nullable": True}]
            ),
            "spec.image: anyOf is not allowed",
        ),
        (
            lambda s: s["properties"]["spec"]["properties"]["checkpoint"].__setitem__(
                "x-kubernetes-preserve-unknown-fields", True
            ),
            "spec.checkpoint: x-kubernetes-preserve-unknown-fields is not allowed here",
        ),
        (
            lambda s: s["properties"]["spec"]["properties"]["image"].pop("description"),
            "spec.image: no description",
        ),
        (
            lambda s: s["properties"]["spec"]["properties"]["args"].pop("maxItems"),
            "spec.args: a list needs maxItems",
        ),
        (
            lambda s: s["properties"]["spec"]["properties"]["image"].pop("maxLength"),
            "spec.image: a string needs maxLength",
        ),
        (
            lambda s: s["properties"]["metadata"]["properties"].__setitem__("labels", {"type": "object"}),
            "metadata: only metadata.name",
        ),
        (
            lambda s: s["properties"]["metadata"].__setitem__("description", "x"),
            "metadata: only metadata.name",
        ),
    ],
)
def test_the_structural_checker_catches_each_violation(mutation, expected: str) -> None:
    schema = copy.deepcopy(openapi_schema())
    mutation(schema)
    problems = structural_problems(schema, preserve_unknown_allowed=PRESERVE_UNKNOWN_ALLOWED)
    assert any(problem.startswith(expected) for problem in problems), problems


def test_the_crd_is_a_valid_kubernetes_1_32_object() -> None:
    kubernetes_validate.validate(crd_from_file(), "1.32", strict=True)


def test_names_subresources_and_printer_columns() -> None:
    crd = crd_from_file()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "resilienttrainingjobs.resilient.training"
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "ResilientTrainingJob",
        "resilienttrainingjobs",
        ["rtj"],
        ["resilient-training"],
    )
    (version,) = crd["spec"]["versions"]
    assert version["name"] == constants.VERSION and version["subresources"] == {"status": {}}
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "State": ("string", ".status.state"),
        "Nodes": ("string", ".status.workers.readyText"),
        "Restarts": ("integer", ".status.restarts.total"),
        "Step": ("integer", ".status.progress.step"),
        "Checkpoint": ("integer", ".status.lastCheckpoint.step"),
        "Checkpointed": ("date", ".status.lastCheckpoint.time"),
        "Goodput": ("number", ".status.progress.goodputPercent"),
        "Age": ("date", ".metadata.creationTimestamp"),
        "Interval": ("integer", ".spec.checkpoint.intervalSteps"),
        "Advised": ("integer", ".status.checkpointAdvice.recommendedIntervalSteps"),
        "Steps-From": ("string", ".status.progress.sources.step"),
    }
    # The interval columns and the step's source only with -o wide.
    wide = {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {"Interval", "Advised", "Steps-From"}
    # Every printer column's path exists in the schema (a typo would print <none> forever).
    schema = openapi_schema()
    for _, path in columns.values():
        if path.startswith(".metadata"):
            continue
        node = schema
        for part in path.strip(".").split("."):
            node = node["properties"][part]


def _rules(node: dict) -> list[str]:
    return [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]


def test_immutable_fields_carry_transition_rules() -> None:
    spec = openapi_schema()["properties"]["spec"]
    props = spec["properties"]
    for field in ("nodes", "instanceType", "rendezvous"):
        assert "self == oldSelf" in _rules(props[field]), field
    checkpoint = props["checkpoint"]["properties"]
    assert "self == oldSelf" in _rules(checkpoint["storage"])
    assert "self == oldSelf" in _rules(checkpoint["mountPath"])
    assert any("oldSelf.processesPerNode" in rule for rule in _rules(spec))
    for key, node in (("nodes", props["nodes"]), ("storage", checkpoint["storage"])):
        assert {"rule": "self == oldSelf", "message": f"{key} is immutable"} in node[
            "x-kubernetes-validations"
        ]


def test_every_optional_spec_field_with_a_python_default_has_a_crd_default() -> None:
    def visit(model: type, node: dict, path: str) -> None:
        for attr, info in model.model_fields.items():
            key = info.alias or attr
            sub = node["properties"][key]
            if not info.is_required() and info.get_default(call_default_factory=True) is not None:
                assert "default" in sub, f"{path}{key}"
            nested = model_type(info.annotation)
            if nested is not None:
                visit(nested, sub, f"{path}{key}.")

    visit(api.ResilientTrainingJobSpec, openapi_schema()["properties"]["spec"], "spec.")


def test_enums_are_camel_case_strings() -> None:
    def visit(node: dict) -> None:
        if "enum" in node:
            assert node["type"] == "string"
            assert all(v[0].isupper() and "_" not in v for v in node["enum"] if "/" not in v), node["enum"]
        for sub in node.get("properties", {}).values():
            visit(sub)
        if isinstance(node.get("items"), dict):
            visit(node["items"])

    visit(openapi_schema()["properties"]["spec"])
    visit(openapi_schema()["properties"]["status"])


def test_crd_yaml_round_trips_to_the_generated_dict() -> None:
    assert yaml.safe_load(api.crd_yaml()) == api.crd()


def test_docs_api_md_is_generated_from_the_current_models() -> None:
    reference = (CRD_FILE.parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    assert reference == crd_cli.reference_markdown(), "run `make crds` to regenerate docs/api.md"
    # Every spec field of every object appears in the reference.
    for key in (
        "hotSpares",
        "initialHeartbeatTimeoutSeconds",
        "fileSystemId",
        "taintExcludedNodes",
        "goodputPercent",
    ):
        assert f"| `{key}` |" in reference


def test_rtj_crd_write_updates_both_files(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crd_cli.main(["--write", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "crds" / CRD_FILE.name).read_text(encoding="utf-8") == api.crd_yaml()
    assert (tmp_path / "docs" / "api.md").read_text(encoding="utf-8") == crd_cli.reference_markdown()
    assert crd_cli.main(["--write", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("up to date") == 2


def _nodes(node: dict, path: str):
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _nodes(node[key], f"{path}[*]")


def test_every_integer_has_an_explicit_minimum_and_maximum() -> None:
    # The API server does not hold a CRD's integers to their int32/int64 format.
    for root in ("spec", "status"):
        for path, node in _nodes(openapi_schema()["properties"][root], root):
            if node.get("type") == "integer":
                assert "minimum" in node and "maximum" in node, path
                bits = 64 if node.get("format") == "int64" else 32
                assert -(2 ** (bits - 1)) <= node["minimum"] <= node["maximum"] <= 2 ** (bits - 1) - 1, path
                # The API server reads bounds as float64: 2^63 - 1 would round past int64 and be refused.
                assert all(int(float(node[k])) == node[k] for k in ("minimum", "maximum")), path


def test_docs_api_md_lists_every_limit() -> None:
    reference = (CRD_FILE.parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    for root in ("spec", "status"):
        for path, node in _nodes(openapi_schema()["properties"][root], root):
            for key in ("minimum", "maximum", "maxLength", "maxItems", "maxProperties", "pattern"):
                if key in node:
                    shown = str(node[key]).replace("|", "\\|")
                    assert shown in reference, (path, key)
            for rule in node.get("x-kubernetes-validations", []):
                assert rule["message"] in reference, (path, rule["rule"])


def test_every_default_passes_the_rules_as_written() -> None:
    # The API server refuses a CRD whose defaults break its own CEL rules, and it checks a default as
    # written: an object default of {} would leave every field a rule compares missing.
    for path, node in _nodes(openapi_schema()["properties"]["spec"], "spec"):
        if isinstance(node.get("default"), dict):
            assert cel_errors_as_written(node, node["default"]) == [], path
