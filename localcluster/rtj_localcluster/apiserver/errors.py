"""API errors as Kubernetes ``Status`` objects (``metav1.Status``), raised by the server's logic.

Every layer of the API server (``store``, ``schema``, ``core``) raises :class:`ApiError`; the HTTP
layer (``server``) turns it into the JSON body and status code clients switch on (kopf and client-go
look at ``reason`` and ``code``; kubectl prints ``message``).
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failed API call: HTTP ``code``, ``reason`` (``NotFound``, ``Conflict``...) and ``message``."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _qualified(group: str, plural: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(group, plural)} "{name}" not found',
        {"name": name, "group": group, "kind": plural},
    )


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(group, plural)} "{name}" already exists',
        {"name": name, "group": group, "kind": plural},
    )


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(group, plural)} "{name}": {why}',
        {"name": name, "group": group, "kind": plural},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message, {})


def forbidden(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{_qualified(group, plural)} "{name}" is forbidden: {why}',
        {"name": name, "group": group, "kind": plural},
    )


class FieldError:
    """One ``details.causes`` entry of a 422 Invalid: a field path, a reason and a message."""

    __slots__ = ("detail", "field", "reason", "value_text")

    def __init__(self, reason: str, field: str, value_text: str | None, detail: str) -> None:
        self.reason = reason
        self.field = field
        self.value_text = value_text
        self.detail = detail

    def message(self) -> str:
        kinds = {
            "FieldValueRequired": "Required value",
            "FieldValueInvalid": "Invalid value",
            "FieldValueNotSupported": "Unsupported value",
            "FieldValueTypeInvalid": "Invalid value",
            "FieldValueForbidden": "Forbidden",
            "FieldValueDuplicate": "Duplicate value",
            "FieldValueTooLong": "Too long",
            "FieldValueTooMany": "Too many",
        }
        text = kinds.get(self.reason, "Invalid value")
        if self.value_text is not None:
            text += f": {self.value_text}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message(), "field": self.field}


def invalid(group: str, kind: str, name: str, errors: list[FieldError]) -> ApiError:
    parts = [f"{e.field}: {e.message()}" if e.field else e.message() for e in errors]
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {summary}',
        {"name": name, "group": group, "kind": kind, "causes": [e.cause() for e in errors]},
    )
