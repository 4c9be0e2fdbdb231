"""Structural-schema handling of custom objects: pruning, defaulting, validation and CEL rules.

For every write of a custom object, ``core`` calls :meth:`StructuralSchema.process` with the
CRD version's ``openAPIV3Schema``, in the order a real API server uses: unknown fields are pruned
(except under ``x-kubernetes-preserve-unknown-fields``), ``null`` values of non-nullable fields are
dropped, ``default``s are applied, the value is validated (types, ``required``, ``enum``, bounds,
``pattern``, lengths, item counts, ``uniqueItems``, list types, ``allOf``/``anyOf``/``oneOf``/``not``)
and ``x-kubernetes-validations`` rules run (``cel``; transition rules only on update, with
``oldSelf`` correlated through object fields, maps and map-type lists). Each failure is a
:class:`~.errors.FieldError` with a field path such as ``spec.nodes``. Validation ratcheting (1.30+:
unchanged invalid values pass on update) is not implemented.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from .cel import CelError, CelUnsupported, Program, compile_rule
from .errors import FieldError

_ABSENT = object()


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _show(value: Any) -> str:
    """A value as Kubernetes field errors print it (Go's %#v-like for scalars, type for composites)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if value is None:
        return "null"
    return str(value)


def _type_ok(schema_type: str, value: Any) -> bool:
    if schema_type == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if schema_type == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if schema_type == "string":
        return isinstance(value, str)
    if schema_type == "boolean":
        return isinstance(value, bool)
    if schema_type == "array":
        return isinstance(value, list)
    if schema_type == "object":
        return isinstance(value, dict)
    return True


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class StructuralSchema:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._programs: dict[str, Program | None] = {}
        self.unsupported: list[str] = []
        self._compile_all(schema)

    def _compile_all(self, node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                source = rule.get("rule", "")
                if source not in self._programs:
                    try:
                        self._programs[source] = compile_rule(source)
                    except CelUnsupported as exc:
                        self._programs[source] = None
                        self.unsupported.append(f"{source}: {exc}")
            for value in node.values():
                self._compile_all(value)
        elif isinstance(node, list):
            for value in node:
                self._compile_all(value)

    def process(
        self, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> tuple[dict[str, Any], list[FieldError]]:
        """Return the pruned and defaulted object and the validation errors (empty if valid)."""
        result = copy.deepcopy(obj)
        self._prune_and_default(result, self.schema, root=True)
        errors: list[FieldError] = []
        root_props = self.schema.get("properties", {})
        for key, value in result.items():
            if key in ("apiVersion", "kind"):
                continue
            if key == "metadata":
                self._validate_metadata(value, root_props.get("metadata"), errors)
                continue
            sub = root_props.get(key)
            if sub is not None:
                old_value = old.get(key, _ABSENT) if old is not None else _ABSENT
                self._validate(value, sub, key, errors, old_value)
        for req in self.schema.get("required") or []:
            if req not in result:
                errors.append(FieldError("FieldValueRequired", req, None, ""))
        self._run_rules(result, self.schema, "", errors, old if old is not None else _ABSENT, root=True)
        return result, errors

    def _validate_metadata(self, meta: Any, schema: Any, errors: list[FieldError]) -> None:
        if not isinstance(schema, dict) or not isinstance(meta, dict):
            return
        for key in ("name", "generateName"):
            sub = schema.get("properties", {}).get(key)
            if sub is not None and key in meta:
                self._validate(meta[key], sub, f"metadata.{key}", errors, _ABSENT)

    # -- pruning and defaulting ------------------------------------------------------------------

    def _prune_and_default(self, value: Any, schema: dict[str, Any], root: bool = False) -> None:
        if isinstance(value, dict):
            props: dict[str, Any] = schema.get("properties") or {}
            additional = schema.get("additionalProperties")
            preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
            embedded = schema.get("x-kubernetes-embedded-resource") is True
            for key in list(value):
                if root and key in ("apiVersion", "kind", "metadata"):
                    continue
                if embedded and key in ("apiVersion", "kind", "metadata"):
                    continue
                sub = props.get(key)
                if sub is None and isinstance(additional, dict):
                    sub = additional
                if sub is None:
                    if not preserve and additional is not True:
                        del value[key]
                    continue
                if value[key] is None and not sub.get("nullable"):
                    del value[key]
                    continue
                self._prune_and_default(value[key], sub)
            for key, sub in props.items():
                if key not in value and "default" in sub:
                    if root and key in ("apiVersion", "kind", "metadata"):
                        continue
                    value[key] = copy.deepcopy(sub["default"])
                    self._prune_and_default(value[key], sub)
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, dict):
                for element in value:
                    self._prune_and_default(element, items)

    # -- validation -------------------------------------------------------------------------------

    def _validate(
        self, value: Any, schema: dict[str, Any], path: str, errors: list[FieldError], old: Any
    ) -> None:
        if value is None:
            if not schema.get("nullable"):
                errors.append(
                    FieldError(
                        "FieldValueTypeInvalid",
                        path,
                        "null",
                        f'{path} in body must be of type {schema.get("type", "object")}: "null"',
                    )
                )
            return
        if schema.get("x-kubernetes-int-or-string"):
            if not (isinstance(value, str) or _type_ok("integer", value)):
                errors.append(
                    FieldError(
                        "FieldValueTypeInvalid",
                        path,
                        _show(value),
                        f'{path} in body must be of type integer-or-string: "{_type_name(value)}"',
                    )
                )
                return
        elif "type" in schema and not _type_ok(schema["type"], value):
            errors.append(
                FieldError(
                    "FieldValueTypeInvalid",
                    path,
                    _show(value),
                    f'{path} in body must be of type {schema["type"]}: "{_type_name(value)}"',
                )
            )
            return
        before = len(errors)
        self._validate_value(value, schema, path, errors)
        if isinstance(value, dict):
            props: dict[str, Any] = schema.get("properties") or {}
            additional = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key)
                old_item = old.get(key, _ABSENT) if isinstance(old, dict) else _ABSENT
                if sub is not None:
                    self._validate(item, sub, _join(path, key), errors, old_item)
                elif isinstance(additional, dict):
                    self._validate(item, additional, _join(path, key), errors, old_item)
            for req in schema.get("required") or []:
                if req not in value:
                    errors.append(FieldError("FieldValueRequired", _join(path, req), None, ""))
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, dict):
                old_by_key = self._correlate(old, schema)
                for i, element in enumerate(value):
                    old_element = old_by_key(element) if old_by_key else _ABSENT
                    self._validate(element, items, f"{path}[{i}]", errors, old_element)
        if len(errors) == before:
            self._run_rules(value, schema, path, errors, old)

    @staticmethod
    def _correlate(old: Any, schema: dict[str, Any]) -> Any:
        """For map-type lists: a function finding an element's old counterpart by its keys."""
        if not isinstance(old, list) or schema.get("x-kubernetes-list-type") != "map":
            return None
        keys = schema.get("x-kubernetes-list-map-keys") or []

        def find(element: Any) -> Any:
            if not isinstance(element, dict):
                return _ABSENT
            for candidate in old:
                if isinstance(candidate, dict) and all(candidate.get(k) == element.get(k) for k in keys):
                    return candidate
            return _ABSENT

        return find

    def _validate_value(
        self, value: Any, schema: dict[str, Any], path: str, errors: list[FieldError]
    ) -> None:
        shown = _show(value)
        enum = schema.get("enum")
        if enum is not None and value not in enum:
            supported = ", ".join(_show(e) for e in enum)
            errors.append(FieldError("FieldValueNotSupported", path, shown, f"supported values: {supported}"))
        if isinstance(value, int | float) and not isinstance(value, bool):
            if "minimum" in schema:
                if schema.get("exclusiveMinimum") is True and value <= schema["minimum"]:
                    errors.append(
                        FieldError(
                            "FieldValueInvalid",
                            path,
                            shown,
                            f"{path} in body should be greater than {schema['minimum']}",
                        )
                    )
                elif value < schema["minimum"]:
                    errors.append(
                        FieldError(
                            "FieldValueInvalid",
                            path,
                            shown,
                            f"{path} in body should be greater than or equal to {schema['minimum']}",
                        )
                    )
            if "maximum" in schema:
                if schema.get("exclusiveMaximum") is True and value >= schema["maximum"]:
                    errors.append(
                        FieldError(
                            "FieldValueInvalid",
                            path,
                            shown,
                            f"{path} in body should be less than {schema['maximum']}",
                        )
                    )
                elif value > schema["maximum"]:
                    errors.append(
                        FieldError(
                            "FieldValueInvalid",
                            path,
                            shown,
                            f"{path} in body should be less than or equal to {schema['maximum']}",
                        )
                    )
            if "multipleOf" in schema and schema["multipleOf"] and value % schema["multipleOf"] != 0:
                errors.append(
                    FieldError(
                        "FieldValueInvalid",
                        path,
                        shown,
                        f"{path} in body should be a multiple of {schema['multipleOf']}",
                    )
                )
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                errors.append(
                    FieldError(
                        "FieldValueTooLong", path, None, f"may not be more than {schema['maxLength']} bytes"
                    )
                )
            if "minLength" in schema and len(value) < schema["minLength"]:
                errors.append(
                    FieldError(
                        "FieldValueInvalid",
                        path,
                        shown,
                        f"{path} in body should be at least {schema['minLength']} chars long",
                    )
                )
            if "pattern" in schema and re.search(schema["pattern"], value) is None:
                errors.append(
                    FieldError(
                        "FieldValueInvalid", path, shown, f"{path} in body should match '{schema['pattern']}'"
                    )
                )
        if isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                errors.append(
                    FieldError(
                        "FieldValueTooMany",
                        path,
                        str(len(value)),
                        f"must have at most {schema['maxItems']} items",
                    )
                )
            if "minItems" in schema and len(value) < schema["minItems"]:
                errors.append(
                    FieldError(
                        "FieldValueInvalid",
                        path,
                        str(len(value)),
                        f"{path} in body should have at least {schema['minItems']} items",
                    )
                )
            list_type = schema.get("x-kubernetes-list-type")
            if schema.get("uniqueItems") or list_type == "set":
                seen: list[Any] = []
                for i, element in enumerate(value):
                    if element in seen:
                        errors.append(FieldError("FieldValueDuplicate", f"{path}[{i}]", _show(element), ""))
                    seen.append(element)
            if list_type == "map":
                keys = schema.get("x-kubernetes-list-map-keys") or []
                seen_keys: list[tuple[Any, ...]] = []
                for i, element in enumerate(value):
                    if isinstance(element, dict):
                        k = tuple(element.get(key) for key in keys)
                        if k in seen_keys:
                            errors.append(
                                FieldError("FieldValueDuplicate", f"{path}[{i}]", _show(element), "")
                            )
                        seen_keys.append(k)
        if isinstance(value, dict):
            if "maxProperties" in schema and len(value) > schema["maxProperties"]:
                errors.append(
                    FieldError(
                        "FieldValueTooMany",
                        path,
                        str(len(value)),
                        f"must have at most {schema['maxProperties']} items",
                    )
                )
            if "minProperties" in schema and len(value) < schema["minProperties"]:
                errors.append(
                    FieldError(
                        "FieldValueInvalid",
                        path,
                        str(len(value)),
                        f"{path} in body should have at least {schema['minProperties']} properties",
                    )
                )
        for sub in schema.get("allOf") or []:
            self._validate(value, {**sub, "type": sub.get("type", schema.get("type"))}, path, errors, _ABSENT)
        if schema.get("anyOf") and not any(self._passes(value, sub, path) for sub in schema["anyOf"]):
            errors.append(
                FieldError("FieldValueInvalid", path, shown, "must validate at least one schema (anyOf)")
            )
        if schema.get("oneOf"):
            matches = sum(1 for sub in schema["oneOf"] if self._passes(value, sub, path))
            if matches != 1:
                errors.append(
                    FieldError(
                        "FieldValueInvalid", path, shown, "must validate one and only one schema (oneOf)"
                    )
                )
        if isinstance(schema.get("not"), dict) and self._passes(value, schema["not"], path):
            errors.append(FieldError("FieldValueInvalid", path, shown, "must not validate the schema (not)"))

    def _passes(self, value: Any, schema: dict[str, Any], path: str) -> bool:
        trial: list[FieldError] = []
        self._validate(value, schema, path, trial, _ABSENT)
        return not trial

    def _run_rules(
        self,
        value: Any,
        schema: dict[str, Any],
        path: str,
        errors: list[FieldError],
        old: Any,
        *,
        root: bool = False,
    ) -> None:
        rules = schema.get("x-kubernetes-validations")
        if not rules:
            return
        for rule in rules:
            program = self._programs.get(rule.get("rule", ""))
            if program is None:
                continue
            variables: dict[str, Any] = {"self": value}
            if program.uses_old_self:
                if old is _ABSENT:
                    if not rule.get("optionalOldSelf"):
                        continue
                    variables["oldSelf"] = None
                else:
                    variables["oldSelf"] = old
            field = path
            if rule.get("fieldPath"):
                field = (
                    path + rule["fieldPath"]
                    if rule["fieldPath"].startswith(("[", "."))
                    else _join(path, rule["fieldPath"])
                )
                field = field.lstrip(".")
            try:
                ok = program.evaluate(variables)
            except CelError as exc:
                errors.append(
                    FieldError(
                        "FieldValueInvalid", field, _show(value), f"{exc} evaluating rule: {program.source}"
                    )
                )
                continue
            if ok is not True:
                message = rule.get("message") or f"failed rule: {program.source}"
                reason = rule.get("reason") or "FieldValueInvalid"
                shown = '"' + schema.get("type", "object") + '"' if not root else '"object"'
                errors.append(
                    FieldError(reason, field, shown if reason == "FieldValueInvalid" else None, message)
                )
