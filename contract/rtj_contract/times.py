"""Timestamps as Kubernetes, the operator and the trainer write them: RFC 3339, any fraction of a
second, ``Z`` or an offset; written in UTC with ``Z``, to the second (as Kubernetes' Time) or the
microsecond (as its MicroTime)."""

from __future__ import annotations

from datetime import UTC, datetime


def parse_rfc3339(value: object) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime (UTC where it names no offset), or None when it is
    absent, not a string or malformed."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text[-1] in "Zz":
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def epoch_seconds(value: object) -> float | None:
    """The Unix time of an RFC 3339 timestamp (:func:`parse_rfc3339`), or None."""
    parsed = parse_rfc3339(value)
    return None if parsed is None else parsed.timestamp()


def format_rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes a Time."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_rfc3339_micro(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, as Kubernetes writes a MicroTime (a Lease's renewTime)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
