"""Validation helpers around the API: readable errors, the structural-schema check, CRD-style defaulting.

:mod:`rtj_operator.api` raises :class:`JobValidationError` (through :func:`format_validation_error`) so
that every message names the offending field by its JSON path, the way the API server does. The
structural-schema checker and the defaulting function work on plain OpenAPI v3 dictionaries, so the
tests (and the Helm chart's checks) can hold the generated CRD to the rules the API server applies.
This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ValidationError

__all__ = [
    "JobValidationError",
    "RuleViolationError",
    "apply_defaults",
    "format_validation_error",
    "structural_problems",
]


class RuleViolationError(ValueError):
    """A failed cross-field rule; ``field_path`` (``.field``) says which field it is reported on."""

    def __init__(self, message: str, field_path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field_path = field_path


class JobValidationError(ValueError):
    """An invalid ResilientTrainingJob: ``problems`` lists (JSON path, message) pairs."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__(
            "\n".join(f"{path}: {message}" if path else message for path, message in self.problems)
        )

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.problems]


def _join_path(parts: Iterable[str | int]) -> str:
    """``spec.env[0].name``; a map key joins with a dot whatever it holds (``spec.podLabels.example.com/k``),
    as in the API server's messages about a custom resource, so both name a field alike."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def format_validation_error(error: ValidationError) -> list[tuple[str, str]]:
    """Turn a pydantic ValidationError into (JSON path, message) pairs that read like the API server's."""
    problems: list[tuple[str, str]] = []
    for item in error.errors(include_url=False):
        loc: list[str | int] = [p for p in item["loc"] if p not in ("[key]",)]
        cause = (item.get("ctx") or {}).get("error")
        message = str(item["msg"])
        if isinstance(cause, RuleViolationError):
            loc += [p for p in cause.field_path.split(".") if p]
            message = cause.message
        elif item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "required value"
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        problems.append((_join_path(loc), message))
    return problems


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Return a copy of ``value`` with the schema's ``default``s filled in, as the API server does.

    A default is applied where a property is absent, and the defaults inside the defaulted value are then
    applied too (``default: {}`` on an object fills that object's own defaults).
    """
    value = copy.deepcopy(value)
    _fill_defaults(schema, value)
    return value


def _fill_defaults(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _fill_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                _fill_defaults(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _fill_defaults(schema["items"], item)


_FORBIDDEN_KEYWORDS = ("$ref", "anyOf", "oneOf", "allOf", "not", "definitions", "$defs", "nullable")


def structural_problems(
    schema: dict[str, Any],
    *,
    preserve_unknown_allowed: Iterable[str] = (),
    require_descriptions: bool = True,
    bounded_for_cel: Iterable[str] = ("spec",),
) -> list[str]:
    """List the ways an ``openAPIV3Schema`` falls short of a structural schema (empty when it is one).

    Beyond the API server's own structural rules (every node typed; no ``$ref``; no ``anyOf``/``oneOf``
    unions; ``properties`` and ``additionalProperties`` exclusive; ``metadata`` restricted to ``name``
    and ``generateName``) it checks the project's: ``x-kubernetes-preserve-unknown-fields`` only at the
    paths in ``preserve_unknown_allowed`` (``spec.volumes[*]`` style), a ``description`` on every
    property, and under the ``bounded_for_cel`` roots every string, list and map bounded (``maxLength``
    or an enum/format, ``maxItems``, ``maxProperties``) so CEL cost estimates stay finite.
    """
    checker = _StructuralChecker(set(preserve_unknown_allowed), require_descriptions, tuple(bounded_for_cel))
    if schema.get("type") != "object":
        checker.problems.append("<root>: the root must have type object")
    checker.check(schema, "", is_property=False)
    return checker.problems


class _StructuralChecker:
    def __init__(self, allowed: set[str], require_descriptions: bool, bounded_roots: tuple[str, ...]) -> None:
        self.allowed = allowed
        self.require_descriptions = require_descriptions
        self.bounded_roots = bounded_roots
        self.problems: list[str] = []

    def _bounded(self, path: str) -> bool:
        return any(path == root or path.startswith((f"{root}.", f"{root}[")) for root in self.bounded_roots)

    def check(self, node: dict[str, Any], path: str, *, is_property: bool) -> None:
        problems = self.problems
        where = path or "<root>"
        for keyword in _FORBIDDEN_KEYWORDS:
            if keyword in node:
                problems.append(f"{where}: {keyword} is not allowed in a structural schema")
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if preserve and path not in self.allowed:
            problems.append(f"{where}: x-kubernetes-preserve-unknown-fields is not allowed here")
        kind = node.get("type")
        if kind not in ("object", "array", "string", "integer", "number", "boolean"):
            problems.append(f"{where}: missing or unknown type {kind!r}")
        if self.require_descriptions and is_property and path != "metadata" and not node.get("description"):
            problems.append(f"{where}: no description")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{where}: properties and additionalProperties are exclusive")
        if isinstance(node.get("additionalProperties"), bool):
            problems.append(f"{where}: additionalProperties must be a schema, not a boolean")
        bounded = self._bounded(path)
        if kind == "object":
            if not (node.get("properties") or isinstance(node.get("additionalProperties"), dict) or preserve):
                problems.append(
                    f"{where}: an object needs properties, additionalProperties or preserve-unknown"
                )
            if isinstance(node.get("additionalProperties"), dict) and bounded and "maxProperties" not in node:
                problems.append(f"{where}: a map needs maxProperties (CEL cost)")
        if kind == "array":
            if not isinstance(node.get("items"), dict):
                problems.append(f"{where}: an array needs items")
            elif bounded and "maxItems" not in node:
                problems.append(f"{where}: a list needs maxItems (CEL cost)")
        if kind == "string" and bounded and not ({"maxLength", "enum", "format"} & node.keys()):
            problems.append(f"{where}: a string needs maxLength (CEL cost)")
        if path == "metadata":
            extra = set(node.get("properties", {})) - {"name", "generateName"}
            if extra or set(node) - {"type", "properties"}:
                problems.append("metadata: only metadata.name and metadata.generateName may be restricted")
            return
        for key, sub in node.get("properties", {}).items():
            self.check(sub, f"{path}.{key}" if path else key, is_property=True)
        if isinstance(node.get("items"), dict):
            self.check(node["items"], f"{path}[*]", is_property=False)
        if isinstance(node.get("additionalProperties"), dict):
            self.check(node["additionalProperties"], f"{path}[*]", is_property=False)
