"""Validate objects against the generated CRD the way an API server does: defaults, schema, CEL rules.

The OpenAPI schema is checked with ``jsonschema`` after the schema's defaults are applied (its ``pattern``
matched by RE2, as the API server's Go regexp does: Python's ``$`` would also match before a final
newline), and every
``x-kubernetes-validations`` rule is evaluated with a real CEL interpreter (``celpy``) on the defaulted
object (transition rules only when an old object is given). Both report (JSON path, message) pairs so
tests can compare them with :func:`rtj_operator.api.parse_job`'s errors.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import re2
import yaml
from jsonschema import ValidationError, validators
from rtj_operator.validation import apply_defaults

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "resilient.training_resilienttrainingjobs.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@functools.cache
def crd_from_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    return loaded


def openapi_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd_from_file()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _join(parts: list[str | int]) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    if validator.is_type(instance, "string") and not re2.search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# Draft 7 (its integer is any whole number, as the API server's: 1.0 is an integer) with RE2 patterns.
_Validator = validators.extend(jsonschema.Draft7Validator, {"pattern": _re2_pattern})


def schema_errors(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """jsonschema errors of the defaulted object, as (JSON path, message); required fields by their path."""
    schema = openapi_schema()
    validator = _Validator(schema)
    problems: list[tuple[str, str]] = []
    for error in validator.iter_errors(apply_defaults(schema, obj)):
        parts: list[str | int] = list(error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [key for key in error.validator_value if key not in error.instance]
            parts += missing[:1]
        problems.append((_join(parts), error.message))
    return problems


# One environment for every rule, made at import: creating one raises the interpreter's recursion limit,
# which must not happen inside a hypothesis example (hypothesis warns about a changed limit).
_CEL = celpy.Environment()


@functools.cache
def _cel_program(rule: str) -> Any:
    return _CEL.program(_CEL.compile(rule))


def _evaluate(rule: str, self_value: Any, old_value: Any) -> bool:
    activation: dict[str, Any] = {"self": celpy.json_to_cel(self_value)}
    if old_value is not None:
        activation["oldSelf"] = celpy.json_to_cel(old_value)
    result = _cel_program(rule).evaluate(activation)
    if isinstance(result, Exception):
        raise result
    return bool(result)


def cel_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Failed CEL rules of the defaulted object (and transition rules against ``old``, if given)."""
    schema = openapi_schema()
    problems: list[tuple[str, str]] = []
    new_value = apply_defaults(schema, obj)
    old_value = apply_defaults(schema, old) if old is not None else None
    _walk(schema, new_value, old_value, [], problems)
    return problems


def _walk(
    schema: dict[str, Any], value: Any, old: Any, parts: list[str | int], problems: list[tuple[str, str]]
) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        is_transition = "oldSelf" in rule["rule"]
        if is_transition and old is None:
            continue
        if not _evaluate(rule["rule"], value, old if is_transition else None):
            field = [p for p in rule.get("fieldPath", "").split(".") if p]
            problems.append((_join([*parts, *field]), rule["message"]))
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                old_sub = old.get(key) if isinstance(old, dict) else None
                _walk(sub, value[key], old_sub, [*parts, key], problems)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        # List items are correlated with old items only for list-maps; our rules on items need none.
        for index, item in enumerate(value):
            _walk(schema["items"], item, None, [*parts, index], problems)


def cel_errors_as_written(schema: dict[str, Any], value: Any) -> list[tuple[str, str]]:
    """Failed CEL rules of ``value`` under ``schema`` with no defaults filled in (how the API server checks
    a schema's own ``default`` values when the CRD is created)."""
    problems: list[tuple[str, str]] = []
    _walk(schema, value, None, [], problems)
    return problems


def crd_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Schema errors, or (when the schema holds) CEL errors: the API server's order."""
    return schema_errors(obj) or cel_errors(obj, old)


def load_example(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded
