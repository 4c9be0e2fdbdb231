"""The API's schema toolkit: field markers, model bases, and the walker that turns models into a CRD schema.

:mod:`rtj_operator.api.spec`, :mod:`~rtj_operator.api.status` and :mod:`~rtj_operator.api.job` declare
models with the markers and bases here; :func:`model_schema` walks a model into a structural OpenAPI v3
schema (types, formats, bounds, defaults, descriptions, CEL rules); :func:`immutable_paths` finds the
fields whose CEL says ``self == oldSelf`` so Python can enforce the same transition rules. Each
cross-field rule is a :class:`CelRule` carrying its CEL (for the API server) and a Python predicate (for
``parse_job``), so the two cannot drift apart.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Self

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from rtj_operator.validation import RuleViolationError

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "ApiModel",
    "CelRule",
    "DateTime",
    "Flag",
    "Immutable",
    "Int32",
    "Int64",
    "SchemaExtra",
    "StatusModel",
    "immutable_paths",
    "model_schema",
    "model_type",
]

# Annotated[...] metadata that the CRD walker understands; pydantic ignores them.


@dataclass(frozen=True, eq=False)  # hashed by identity: typing hashes Annotated metadata in unions
class SchemaExtra:
    """Extra OpenAPI keywords for one schema node (a format, a list type, ...)."""

    keywords: Mapping[str, Any]


@dataclass(frozen=True)
class Immutable:
    """The field may not change once the object exists (CEL ``self == oldSelf``)."""


class CelRule(NamedTuple):
    """A validation rule of one object, in CEL for the API server and in Python for :func:`parse_job`.

    ``field_path`` (relative, like ``.heartbeatTimeoutSeconds``) names the field a violation is
    reported on, in both places.
    """

    rule: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The API server reads a schema's bounds as float64, and 2^63 - 1 rounds to 2^63, which it refuses as the
# maximum of an int64 field (and so every object): int64 fields stay within the integers a float64 holds
# exactly.
INT64_MIN, INT64_MAX = -(2**53 - 1), 2**53 - 1


def _whole_number(value: Any) -> Any:
    """A float with no fraction (``nodes: 1.0``) is an integer, as the API server's schema check says."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Kubernetes does not hold CRD integers to their format's range: each carries explicit bounds, the
# format's unless the field narrows them (a field's ge/le come after these and win in the schema).
Int32 = Annotated[int, BeforeValidator(_whole_number), Strict(), Field(ge=INT32_MIN, le=INT32_MAX)]
Int64 = Annotated[
    int,
    BeforeValidator(_whole_number),
    Strict(),
    Field(ge=INT64_MIN, le=INT64_MAX),
    SchemaExtra({"format": "int64"}),
]
Flag = Annotated[bool, Strict()]
DateTime = Annotated[str, SchemaExtra({"format": "date-time"})]


class ApiModel(BaseModel):
    """Base of the spec models: camelCase JSON names, unknown fields rejected, CEL rules checked."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid", frozen=True
    )
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in type(self).cel_rules:
            if not rule.check(self):
                raise RuleViolationError(rule.message, rule.field_path)
        return self


class StatusModel(BaseModel):
    """Base of the status models: camelCase JSON names; unknown fields ignored (other writers exist)."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="ignore"
    )
    # Status is observation: the CRD declares no defaults for it (Python keeps its convenient ones).
    crd_defaults: ClassVar[bool] = False

    def to_status(self) -> dict[str, Any]:
        """The JSON form written to the job's status: camelCase names, unset fields left out."""
        written: dict[str, Any] = self.model_dump(by_alias=True, mode="json", exclude_none=True)
        return written


def _all_metadata(info: FieldInfo) -> list[Any]:
    return _flatten_metadata(list(info.metadata))


def _flatten_metadata(items: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for item in items:
        if isinstance(item, FieldInfo):
            flat += _flatten_metadata(list(item.metadata))
        else:
            flat.append(item)
    return flat


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """Strip Annotated and ``| None`` from a type; return the bare type and the Annotated metadata."""
    metadata: list[Any] = []
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            args = typing.get_args(annotation)
            annotation, metadata = args[0], metadata + _flatten_metadata(list(args[1:]))
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                raise TypeError(f"unions other than X | None have no structural schema: {annotation}")
            annotation = members[0]
        else:
            return annotation, metadata


def model_type(annotation: Any) -> type[BaseModel] | None:
    bare, _ = _unwrap(annotation)
    return bare if isinstance(bare, type) and issubclass(bare, BaseModel) else None


def _constraints(node: dict[str, Any], metadata: list[Any]) -> None:
    """Translate pydantic/annotated-types constraints and schema markers into OpenAPI keywords."""
    kind = str(node.get("type"))
    for item in metadata:
        # Every bound holds in pydantic: the schema keeps the tightest (a field's own, over its type's).
        if isinstance(item, annotated_types.Ge):
            node["minimum"] = max(node.get("minimum", item.ge), item.ge)
        elif isinstance(item, annotated_types.Le):
            node["maximum"] = min(node.get("maximum", item.le), item.le)
        elif isinstance(item, annotated_types.MinLen):
            if item.min_length:
                node[{"string": "minLength", "array": "minItems", "object": "minProperties"}[kind]] = (
                    item.min_length
                )
        elif isinstance(item, annotated_types.MaxLen):
            node[{"string": "maxLength", "array": "maxItems", "object": "maxProperties"}[kind]] = (
                item.max_length
            )
        elif isinstance(item, SchemaExtra):
            node.update(item.keywords)
        elif getattr(item, "pattern", None) is not None:
            node["pattern"] = item.pattern
        elif isinstance(item, (Immutable, Strict)):
            pass
        elif isinstance(item, (annotated_types.Gt, annotated_types.Lt)):
            raise TypeError("use ge/le: exclusive bounds differ between OpenAPI v3.0 and JSON Schema")


def _type_schema(annotation: Any, metadata: list[Any]) -> dict[str, Any]:
    bare, inner = _unwrap(annotation)
    metadata = inner + metadata
    node: dict[str, Any]
    origin = typing.get_origin(bare)
    if isinstance(bare, type) and issubclass(bare, enum.Enum):
        node = {"type": "string", "enum": [member.value for member in bare]}
    elif origin is Literal:
        node = {"type": "string", "enum": list(typing.get_args(bare))}
    elif bare is bool:
        node = {"type": "boolean"}
    elif bare is int:
        node = {"type": "integer", "format": "int32"}
    elif bare is float:
        node = {"type": "number"}
    elif bare is str:
        node = {"type": "string"}
    elif origin is list:
        (item,) = typing.get_args(bare)
        node = {"type": "array", "items": _type_schema(item, [])}
    elif origin is dict:
        _key, value = typing.get_args(bare)
        node = {"type": "object"}
        if value is not Any:
            node["additionalProperties"] = _type_schema(value, [])
    elif isinstance(bare, type) and issubclass(bare, BaseModel):
        node = model_schema(bare)
    else:
        raise TypeError(f"no structural schema for {bare!r}")
    _constraints(node, metadata)
    return node


def _default_value(info: FieldInfo) -> Any:
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        # The whole defaulted object, not {}: the API server checks a default against the CEL rules as
        # written, without filling in the defaults nested in it, and {} would break every rule that
        # compares two of its fields (the CRD would be refused).
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    return value


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    override: dict[str, Any] | None = getattr(model, "crd_schema_override", None)
    if override is not None:
        return dict(override)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for attr, info in model.model_fields.items():
        key = info.alias or attr
        if info.description is None or not info.description.startswith(f"{key} "):
            raise ValueError(f"{model.__name__}.{attr}: the description must start with {key!r}")
        node: dict[str, Any] = {"description": info.description}
        node.update(_type_schema(info.annotation, _all_metadata(info)))
        if isinstance(info.json_schema_extra, dict):
            node.update(info.json_schema_extra)
        if info.is_required():
            required.append(key)
        elif getattr(model, "crd_defaults", True):
            default = _default_value(info)
            if default is not None:
                node["default"] = default
        if any(isinstance(m, Immutable) for m in _all_metadata(info)):
            node.setdefault("x-kubernetes-validations", []).append(
                {"rule": "self == oldSelf", "message": f"{key} is immutable"}
            )
        properties[key] = node
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if model.model_config.get("extra") == "allow":
        schema["x-kubernetes-preserve-unknown-fields"] = True
    rules = getattr(model, "cel_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [_cel_rule_json(rule) for rule in rules]
    return schema


def _cel_rule_json(rule: CelRule) -> dict[str, Any]:
    node: dict[str, Any] = {"rule": rule.rule, "message": rule.message}
    if rule.field_path:
        node["fieldPath"] = rule.field_path
    return node


def immutable_paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, tuple[str, ...]]]:
    """(JSON path, Python attribute path) of every field marked immutable, depth first."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for attr, info in model.model_fields.items():
        key = info.alias or attr
        if any(isinstance(m, Immutable) for m in _all_metadata(info)):
            found.append((f"{prefix}{key}", (attr,)))
        nested = model_type(info.annotation)
        if nested is not None and issubclass(nested, ApiModel):
            found += [(path, (attr, *attrs)) for path, attrs in immutable_paths(nested, f"{prefix}{key}.")]
    for rule in getattr(model, "cel_rules", ()):
        if "oldSelf" in rule.rule and rule.field_path:
            field = rule.field_path.lstrip(".")
            attr = next(a for a, i in model.model_fields.items() if (i.alias or a) == field)
            found.append((f"{prefix}{field}", (attr,)))
    return found
