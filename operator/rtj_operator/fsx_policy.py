"""Which FSx for Lustre file systems the jobs of each namespace may mount: the administrator's allow-list.

A job with `spec.checkpoint.storage.fsxStatic` makes the operator create a cluster-scoped
PersistentVolume for that file system; without a check, anyone allowed to create a job could mount
any file system of the account by its id. The operator is given an allow-list (the chart's
`fsx.allowedFileSystems`, passed as `--allow-fsx NAMESPACE=FILESYSTEM` flags): `decide.filesystems`
creates nothing for a job whose file system is not on it for the job's namespace.

An entry names a namespace (or `*`: every namespace) and a file system by its id (`fs-0123...`), by
its DNS name, or `*` (any file system). An id matches a job that names that id and that id's FSx DNS
name (`<id>.fsx.<region>.amazonaws.com`: the CSI driver mounts by DNS name, so an allowed id with
another file system's DNS name is refused). A DNS name matches a job that names it (and, when it is
an FSx DNS name, the id in it). An empty allow-list allows nothing. Pure; imported by `observe` (the
allow-list travels in `Observed`) and `runtime` (parsed from the command line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ANY: str = "*"
FILE_SYSTEM_ID = re.compile(r"fs-[0-9a-f]{8,17}")
FIELD_ID = "spec.checkpoint.storage.fsxStatic.fileSystemId"
FIELD_DNS = "spec.checkpoint.storage.fsxStatic.dnsName"


class AllowListError(ValueError):
    """An allow-list entry that is not NAMESPACE=FILESYSTEM."""


def _id_in_dns_name(dns_name: str) -> str | None:
    """The file system id an FSx DNS name starts with (`fs-0123....fsx.<region>.amazonaws.com`)."""
    first = dns_name.lower().split(".", 1)[0]
    return first if FILE_SYSTEM_ID.fullmatch(first) and ".fsx." in dns_name.lower() else None


@dataclass(frozen=True)
class FsxAllowList:
    """Namespace (or `*`) -> the file systems (ids, DNS names or `*`) its jobs may mount."""

    entries: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, items: Iterable[str]) -> FsxAllowList:
        """From `NAMESPACE=FILESYSTEM[,FILESYSTEM...]` items (the operator's `--allow-fsx` flags)."""
        entries: dict[str, set[str]] = {}
        for item in items:
            namespace, sep, systems = item.partition("=")
            names = [s.strip().lower() for s in systems.split(",") if s.strip()]
            if not sep or not namespace.strip() or not names:
                raise AllowListError(f"--allow-fsx {item!r}: expected NAMESPACE=FILESYSTEM[,FILESYSTEM...]")
            for name in names:
                if name != ANY and "." not in name and not FILE_SYSTEM_ID.fullmatch(name):
                    raise AllowListError(
                        f"--allow-fsx {item!r}: {name!r} is neither a file system id (fs-...), "
                        f"a DNS name nor {ANY}"
                    )
            entries.setdefault(namespace.strip(), set()).update(names)
        return cls({ns: frozenset(names) for ns, names in entries.items()})

    def for_namespace(self, namespace: str) -> frozenset[str]:
        return self.entries.get(namespace, frozenset()) | self.entries.get(ANY, frozenset())

    def refusal(self, namespace: str, file_system_id: str, dns_name: str) -> str | None:
        """None when a job in `namespace` may mount the file system; else why not, naming the field."""
        allowed = self.for_namespace(namespace)
        fs_id, dns = file_system_id.lower(), dns_name.lower().rstrip(".")
        if ANY in allowed:
            return None
        dns_id = _id_in_dns_name(dns)
        if dns in allowed and dns_id in (None, fs_id):
            return None
        if fs_id in allowed:
            if dns_id == fs_id:
                return None
            return (
                f"{FIELD_DNS} {dns_name!r} is not the DNS name of file system {file_system_id} "
                f"(<id>.fsx.<region>.amazonaws.com), and only that file system is allowed for "
                f"namespace {namespace!r}"
            )
        listed = ", ".join(sorted(allowed)) or "none"
        return (
            f"{FIELD_ID} {file_system_id} ({FIELD_DNS} {dns_name}) is not allowed for namespace "
            f"{namespace!r}: the operator's FSx allow-list (chart value fsx.allowedFileSystems) "
            f"allows {listed} there"
        )
