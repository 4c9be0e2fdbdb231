"""Decoding of the Kubernetes protobuf encoding for the few kinds clients send that way.

Typed client-go clientsets (Helm's release storage, ``kubectl create``) send
``application/vnd.kubernetes.protobuf`` request bodies and do not fall back to JSON on 415. This
module decodes the envelope (``k8s\\0`` + ``runtime.Unknown``) and the messages such clients write:
Secret, ConfigMap, Namespace, ServiceAccount (with ObjectMeta) and DeleteOptions, into the JSON
form the rest of the server uses. Responses stay JSON, which client-go accepts. Field numbers are
those of k8s.io/api's generated.proto files.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from .errors import ApiError

MAGIC = b"k8s\x00"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value: int or bytes) for each field of a message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire == 1:
            yield number, wire, int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wire == 5:
            yield number, wire, int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ApiError(400, "BadRequest", f"unsupported protobuf wire type {wire}")


def _text(value: bytes) -> str:
    return value.decode()


def _time(value: bytes) -> str:
    seconds = next((v for n, _, v in _fields(value) if n == 1), 0)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _map(value: bytes, convert: Callable[[bytes], Any]) -> tuple[str, Any]:
    key, item = "", b""
    for number, _, field in _fields(value):
        if number == 1:
            key = field.decode()
        elif number == 2:
            item = field
    return key, convert(item)


def _owner_reference(value: bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    ref: dict[str, Any] = {}
    for number, _, field in _fields(value):
        if number in names:
            ref[names[number]] = field.decode()
        elif number == 6:
            ref["controller"] = bool(field)
        elif number == 7:
            ref["blockOwnerDeletion"] = bool(field)
    return ref


def _object_meta(value: bytes) -> dict[str, Any]:
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    meta: dict[str, Any] = {}
    for number, _, field in _fields(value):
        if number in strings:
            meta[strings[number]] = field.decode()
        elif number == 7:
            meta["generation"] = field
        elif number == 8:
            meta["creationTimestamp"] = _time(field)
        elif number in (11, 12):
            key, item = _map(field, _text)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = item
        elif number == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(field))
        elif number == 14:
            meta.setdefault("finalizers", []).append(field.decode())
    return meta


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _secret(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret"}
    for number, _, field in _fields(raw):
        if number == 1:
            obj["metadata"] = _object_meta(field)
        elif number == 2:
            key, item = _map(field, _b64)
            obj.setdefault("data", {})[key] = item
        elif number == 3:
            obj["type"] = field.decode()
        elif number == 4:
            key, item = _map(field, _text)
            obj.setdefault("stringData", {})[key] = item
        elif number == 5:
            obj["immutable"] = bool(field)
    return obj


def _config_map(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap"}
    for number, _, field in _fields(raw):
        if number == 1:
            obj["metadata"] = _object_meta(field)
        elif number == 2:
            key, item = _map(field, _text)
            obj.setdefault("data", {})[key] = item
        elif number == 3:
            key, item = _map(field, _b64)
            obj.setdefault("binaryData", {})[key] = item
        elif number == 4:
            obj["immutable"] = bool(field)
    return obj


def _namespace(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace"}
    for number, _, field in _fields(raw):
        if number == 1:
            obj["metadata"] = _object_meta(field)
        elif number == 2:
            finalizers = [v.decode() for n, _, v in _fields(field) if n == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


def _service_account(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount"}
    for number, _, field in _fields(raw):
        if number == 1:
            obj["metadata"] = _object_meta(field)
        elif number == 3:
            name = next((v.decode() for n, _, v in _fields(field) if n == 1), "")
            obj.setdefault("imagePullSecrets", []).append({"name": name})
        elif number == 4:
            obj["automountServiceAccountToken"] = bool(field)
    return obj


def _delete_options(raw: bytes) -> dict[str, Any]:
    options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    for number, _, field in _fields(raw):
        if number == 1:
            options["gracePeriodSeconds"] = field
        elif number == 2:
            pre: dict[str, str] = {}
            for n, _, v in _fields(field):
                pre["uid" if n == 1 else "resourceVersion"] = v.decode()
            options["preconditions"] = pre
        elif number == 3:
            options["orphanDependents"] = bool(field)
        elif number == 4:
            options["propagationPolicy"] = field.decode()
        elif number == 5:
            options.setdefault("dryRun", []).append(field.decode())
    return options


_DECODERS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "Secret": _secret,
    "ConfigMap": _config_map,
    "Namespace": _namespace,
    "ServiceAccount": _service_account,
    "DeleteOptions": _delete_options,
}


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded request body (415 for kinds this module does not know)."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "BadRequest", "protobuf body without the k8s envelope")
    kind, raw = "", b""
    for number, _, field in _fields(body[len(MAGIC) :]):
        if number == 1:
            for n, _, v in _fields(field):
                if n == 2:
                    kind = v.decode()
        elif number == 2:
            raw = field
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"protobuf bodies of kind {kind!r} are not supported: send application/json",
        )
    return decoder(raw)
