"""Kubernetes types embedded in the spec, held to the rules the API server applies to the pod they become.

A job's env, volumes, mounts, tolerations and node affinity terms are copied into its pods and claims;
:mod:`rtj_operator.api.spec` uses the models and the name and quantity grammars here, so that a spec the
CRD accepts always renders children the API server accepts (pkg/apis/core/validation is the reference).
Where a grammar fits in a pattern it is one; what needs more (a path without ``..`` elements, a
qualified name's prefix length, rules across fields) is a :class:`CelRule`, checked as CEL by the API
server and in Python by :func:`~rtj_operator.api.parse_job`. The patterns use only what Go's RE2, Rust's
regex (pydantic) and Python's re agree on; ``$`` means the end of the text in all three here, as the
tests check (a trailing newline is no exception).
"""

from __future__ import annotations

import enum
import re
from typing import Annotated

from pydantic import Field, Strict

from rtj_operator.api.schema import ApiModel, CelRule, Flag, Int32, Int64

# Every string has a maxLength and every list a maxItems: the API server's CEL cost estimate needs them.

# --- Kubernetes' grammars (apimachinery validation) -------------------------------------------------
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME_PART = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
DNS_LABEL_PATTERN: str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN: str = rf"^{_SUBDOMAIN}$"
# Label and annotation keys, taint keys: an optional DNS-subdomain prefix and '/', then a name of at most
# 63 characters. The prefix's limit (253) is QUALIFIED_NAME_LONG_PREFIX's business: RE2 cannot count it.
QUALIFIED_NAME_PATTERN: str = rf"^({_SUBDOMAIN}/)?{_NAME_PART}$"
QUALIFIED_NAME_LONG_PREFIX: str = r"^[^/]{254,}/"
MAX_QUALIFIED_NAME_LENGTH: int = 253 + 1 + 63
LABEL_VALUE_PATTERN: str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# IsEnvVarName (the strict form every supported Kubernetes accepts); never ".", never starting "..".
ENV_VAR_NAME_PATTERN: str = r"^([-_a-zA-Z]|\.[-_a-zA-Z0-9])[-._a-zA-Z0-9]*$"
# IsConfigMapKey: ConfigMap and Secret keys; never ".", never starting "..".
CONFIG_KEY_PATTERN: str = r"^([-_a-zA-Z0-9]|\.[-_a-zA-Z0-9])[-._a-zA-Z0-9]*$"
# An image reference: printable ASCII without spaces (Kubernetes refuses blank images and surrounding
# whitespace; no registry accepts whitespace or control characters anywhere in a reference).
IMAGE_PATTERN: str = r"^[!-~]+$"
# CSI driver names: a DNS subdomain, ignoring case, of at most 63 characters.
CSI_DRIVER_PATTERN: str = (
    r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$"
)

# Resource quantities (apimachinery resource.Quantity) without a sign: every quantity in a job is a size
# or a request, which Kubernetes holds non-negative; some must be positive (a claim's capacity).
_QUANTITY_SUFFIX = r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
QUANTITY_PATTERN: str = rf"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+)){_QUANTITY_SUFFIX}$"
POSITIVE_QUANTITY_PATTERN: str = (
    rf"^(([0-9]*[1-9][0-9]*(\.[0-9]*)?)|([0-9]*\.[0-9]*[1-9][0-9]*)){_QUANTITY_SUFFIX}$"
)

Name = Annotated[str, Strict(), Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
# A name that may be empty (Kubernetes reads "" as "none": storageClassName "" means no class).
OptionalName = Annotated[str, Strict(), Field(max_length=253, pattern=rf"^({_SUBDOMAIN})?$")]
DnsLabel = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
Quantity = Annotated[str, Strict(), Field(max_length=64, pattern=QUANTITY_PATTERN)]
PositiveQuantity = Annotated[str, Strict(), Field(max_length=64, pattern=POSITIVE_QUANTITY_PATTERN)]
QualifiedName = Annotated[
    str, Strict(), Field(min_length=1, max_length=MAX_QUALIFIED_NAME_LENGTH, pattern=QUALIFIED_NAME_PATTERN)
]
# Map keys carry no pattern of their own: a CRD cannot constrain map keys in its schema, so a CelRule on the
# map (keys_are_qualified_names) checks them, and names the map in both places.
MapKey = Annotated[str, Strict()]
LabelValue = Annotated[str, Strict(), Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
Image = Annotated[str, Strict(), Field(min_length=1, max_length=1024, pattern=IMAGE_PATTERN)]
EnvName = Annotated[str, Strict(), Field(min_length=1, max_length=256, pattern=ENV_VAR_NAME_PATTERN)]
EnvValue = Annotated[str, Strict(), Field(max_length=32768)]
ConfigKey = Annotated[str, Strict(), Field(min_length=1, max_length=253, pattern=CONFIG_KEY_PATTERN)]
AbsolutePath = Annotated[str, Strict(), Field(min_length=2, max_length=256, pattern=r"^/.+$")]
MountPath = Annotated[str, Strict(), Field(min_length=1, max_length=256, pattern=r"^/.*$")]
RelativePath = Annotated[str, Strict(), Field(min_length=1, max_length=256, pattern=r"^[^/].*$")]
HostPath = Annotated[str, Strict(), Field(min_length=1, max_length=1024, pattern=r"^/.*$")]
FileMode = Annotated[Int32, Field(ge=0, le=0o777)]


def matches(pattern: str, text: str) -> bool:
    """RE2's ``matches`` in Python: ``$`` at a pattern's end means the end of the text, as in Go."""
    return (
        re.search(pattern.removesuffix("$") + r"\Z" if pattern.endswith("$") else pattern, text) is not None
    )


def cel_string(text: str) -> str:
    """A CEL string literal of ``text`` (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def is_qualified_name(text: str) -> bool:
    return matches(QUALIFIED_NAME_PATTERN, text) and not matches(QUALIFIED_NAME_LONG_PREFIX, text)


def has_backstep(path: str) -> bool:
    """Whether a path has a ``..`` element (Kubernetes refuses them in host, sub and item paths)."""
    return ".." in path.split("/")


def _cel_backstep(expr: str) -> str:
    """CEL for has_backstep (plain string functions: no regex, a small cost)."""
    return (
        f"({expr} == '..' || {expr}.startsWith('../') || {expr}.contains('/../') || {expr}.endsWith('/..'))"
    )


QUALIFIED_NAME_TEXT = (
    "an optional DNS-subdomain prefix of at most 253 characters and '/', then a name of at most 63 "
    "alphanumerics, '-', '_' or '.' that starts and ends alphanumeric"
)


def keys_are_qualified_names(field: str, attr: str) -> CelRule:
    """Every key of the map ``field`` (JSON name; ``attr`` in Python) is a qualified name."""
    return CelRule(
        rule=(
            f"!has(self.{field}) || self.{field}.all(k, k.matches({cel_string(QUALIFIED_NAME_PATTERN)}) && "
            f"!k.matches({cel_string(QUALIFIED_NAME_LONG_PREFIX)}))"
        ),
        message=f"every key of {field} must be a qualified name: {QUALIFIED_NAME_TEXT}",
        check=lambda s: all(is_qualified_name(key) for key in getattr(s, attr)),
        field_path=f".{field}",
    )


def prefix_fits(field: str, attr: str) -> CelRule:
    """The prefix of the qualified-name field ``field`` has at most 253 characters."""
    return CelRule(
        rule=f"!has(self.{field}) || !self.{field}.matches({cel_string(QUALIFIED_NAME_LONG_PREFIX)})",
        message=f"{field} must be a qualified name: {QUALIFIED_NAME_TEXT}",
        check=lambda s: getattr(s, attr) is None or not matches(QUALIFIED_NAME_LONG_PREFIX, getattr(s, attr)),
        field_path=f".{field}",
    )


def _exactly_one(fields: dict[str, str], what: str) -> CelRule:
    """Exactly one of ``fields`` (JSON name -> Python attribute) is set."""
    listed = ", ".join(fields)
    return CelRule(
        rule=f"[{', '.join(f'has(self.{f})' for f in fields)}].filter(x, x).size() == 1",
        message=f"{what} must set exactly one of {listed}",
        check=lambda s: sum(getattr(s, attr) is not None for attr in fields.values()) == 1,
    )


# --- env ---------------------------------------------------------------------------------------------
ENV_FIELD_PATHS: tuple[str, ...] = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_FIELD_PATH_PATTERN = (
    rf"^({'|'.join(re.escape(p) for p in ENV_FIELD_PATHS)}"
    rf"|metadata\.(labels|annotations)\['({_SUBDOMAIN}/)?{_NAME_PART}'\])$"
)
_RESOURCE_PATTERN = r"^(limits|requests)\.(cpu|memory|ephemeral-storage|hugepages-[0-9]+[KMGTPE]i)$"
CPU_DIVISORS: tuple[str, ...] = ("1m", "1")
BYTE_DIVISORS: tuple[str, ...] = (
    "1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei",
)  # fmt: skip


class ObjectFieldSelector(ApiModel):
    """A field of the pod, exposed as an environment variable (the downward API)."""

    api_version: Annotated[str, Strict(), Field(max_length=2, pattern=r"^v1$")] | None = Field(
        default=None, description="apiVersion is the schema version of fieldPath: v1. Optional; default: v1."
    )
    field_path: Annotated[str, Strict(), Field(max_length=340, pattern=_FIELD_PATH_PATTERN)] = Field(
        description=(
            f"fieldPath is one of {', '.join(ENV_FIELD_PATHS)}, metadata.labels['<key>'] or "
            "metadata.annotations['<key>']. Required."
        )
    )


class ResourceFieldSelector(ApiModel):
    """A resource request or limit of the container, exposed as an environment variable."""

    cel_rules = (
        CelRule(
            rule=(
                "!has(self.divisor) || (self.resource.endsWith('.cpu') ? "
                f"self.divisor in {list(CPU_DIVISORS)!r} : self.divisor in {list(BYTE_DIVISORS)!r})"
            ),
            message=f"divisor must be one of {', '.join(CPU_DIVISORS)} for cpu, and one of "
            f"{', '.join(BYTE_DIVISORS)} for memory, ephemeral-storage and hugepages",
            check=lambda s: (
                s.divisor is None
                or s.divisor in (CPU_DIVISORS if s.resource.endswith(".cpu") else BYTE_DIVISORS)
            ),
            field_path=".divisor",
        ),
    )

    container_name: DnsLabel | None = Field(
        default=None, description="containerName is the container whose resource is read. Optional."
    )
    resource: Annotated[str, Strict(), Field(max_length=64, pattern=_RESOURCE_PATTERN)] = Field(
        description="resource is limits.<name> or requests.<name>, for cpu, memory, ephemeral-storage or "
        "hugepages-<size>. Required."
    )
    divisor: Quantity | None = Field(
        default=None,
        description="divisor scales the value (1m or 1 for cpu; 1, 1Ki, 1Mi, ... for bytes). "
        "Optional; default: 1.",
    )


class ConfigMapKeySelector(ApiModel):
    """A key of a ConfigMap in the job's namespace."""

    name: Name = Field(description="name is the ConfigMap's name. Required.")
    key: ConfigKey = Field(description="key is the key within the ConfigMap. Required.")
    optional: Flag | None = Field(
        default=None, description="optional allows the ConfigMap or key to be missing. Optional."
    )


class SecretKeySelector(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: Name = Field(description="name is the Secret's name. Required.")
    key: ConfigKey = Field(description="key is the key within the Secret. Required.")
    optional: Flag | None = Field(
        default=None, description="optional allows the Secret or key to be missing. Optional."
    )


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from: exactly one source."""

    cel_rules = (
        _exactly_one(
            {
                "fieldRef": "field_ref",
                "resourceFieldRef": "resource_field_ref",
                "configMapKeyRef": "config_map_key_ref",
                "secretKeyRef": "secret_key_ref",
            },
            "valueFrom",
        ),
    )

    field_ref: ObjectFieldSelector | None = Field(
        default=None, description="fieldRef selects a field of the pod. Optional; one of four."
    )
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None,
        description="resourceFieldRef selects a resource of the container. Optional; one of four.",
    )
    config_map_key_ref: ConfigMapKeySelector | None = Field(
        default=None, description="configMapKeyRef selects a key of a ConfigMap. Optional; one of four."
    )
    secret_key_ref: SecretKeySelector | None = Field(
        default=None, description="secretKeyRef selects a key of a Secret. Optional; one of four."
    )


class EnvVar(ApiModel):
    """An environment variable of the worker container."""

    cel_rules = (
        CelRule(
            rule="!(has(self.value) && has(self.valueFrom))",
            message="value and valueFrom are mutually exclusive",
            check=lambda s: s.value is None or s.value_from is None,
        ),
    )

    name: EnvName = Field(
        description="name is the variable's name: letters, digits, '_', '-' and '.', not starting with a "
        "digit or '..'. Required."
    )
    value: EnvValue | None = Field(default=None, description="value is the variable's value. Optional.")
    value_from: EnvVarSource | None = Field(
        default=None,
        description="valueFrom takes the value from the pod (fieldRef), the container's resources "
        "(resourceFieldRef), a ConfigMap or a Secret. Optional.",
    )


# --- volumes -----------------------------------------------------------------------------------------
class StorageMedium(enum.StrEnum):
    # Memory: a tmpfs.
    MEMORY = "Memory"
    # HugePages: hugepages of the pod's one hugepage size; HugePages-<size>: of that size.
    HUGE_PAGES = "HugePages"
    HUGE_PAGES_2MI = "HugePages-2Mi"
    HUGE_PAGES_1GI = "HugePages-1Gi"


class HostPathType(enum.StrEnum):
    DIRECTORY_OR_CREATE = "DirectoryOrCreate"
    DIRECTORY = "Directory"
    FILE_OR_CREATE = "FileOrCreate"
    FILE = "File"
    SOCKET = "Socket"
    CHAR_DEVICE = "CharDevice"
    BLOCK_DEVICE = "BlockDevice"


class KeyToPath(ApiModel):
    """One key of a ConfigMap or Secret, projected to a file."""

    cel_rules = (
        CelRule(
            rule=f"!self.path.startsWith('..') && !{_cel_backstep('self.path')}",
            message="path must not contain '..' elements or start with '..'",
            check=lambda s: not s.path.startswith("..") and not has_backstep(s.path),
            field_path=".path",
        ),
    )

    key: ConfigKey = Field(description="key is the key to project. Required.")
    path: RelativePath = Field(description="path is the file's relative path in the volume. Required.")
    mode: FileMode | None = Field(
        default=None, description="mode is the file's permission bits (0 to 0777). Optional."
    )


class EmptyDirVolumeSource(ApiModel):
    """A scratch directory that lives as long as the pod."""

    medium: StorageMedium | None = Field(
        default=None,
        description="medium is Memory, HugePages, HugePages-2Mi or HugePages-1Gi. Optional; default: the "
        "node's disk.",
    )
    size_limit: Quantity | None = Field(
        default=None, description="sizeLimit bounds the directory's size (a quantity). Optional."
    )


class ConfigMapVolumeSource(ApiModel):
    """A ConfigMap's keys as files."""

    name: Name = Field(description="name is the ConfigMap's name. Required.")
    items: list[KeyToPath] | None = Field(
        default=None, max_length=64, description="items selects keys and their paths. Optional; default: all."
    )
    default_mode: FileMode | None = Field(
        default=None, description="defaultMode is the files' permission bits (0 to 0777). Optional."
    )
    optional: Flag | None = Field(default=None, description="optional allows the ConfigMap to be missing.")


class SecretVolumeSource(ApiModel):
    """A Secret's keys as files."""

    secret_name: Name = Field(description="secretName is the Secret's name. Required.")
    items: list[KeyToPath] | None = Field(
        default=None, max_length=64, description="items selects keys and their paths. Optional; default: all."
    )
    default_mode: FileMode | None = Field(
        default=None, description="defaultMode is the files' permission bits (0 to 0777). Optional."
    )
    optional: Flag | None = Field(default=None, description="optional allows the Secret to be missing.")


class PersistentVolumeClaimVolumeSource(ApiModel):
    """A PersistentVolumeClaim in the job's namespace."""

    claim_name: Name = Field(description="claimName is the claim's name. Required.")
    read_only: Flag | None = Field(default=None, description="readOnly mounts the claim read-only. Optional.")


class HostPathVolumeSource(ApiModel):
    """A file or directory of the node."""

    cel_rules = (
        CelRule(
            rule=f"!{_cel_backstep('self.path')}",
            message="path must not contain '..' elements",
            check=lambda s: not has_backstep(s.path),
            field_path=".path",
        ),
    )

    path: HostPath = Field(description="path is the absolute path on the node. Required.")
    type: HostPathType | None = Field(
        default=None,
        description="type is what must be at the path: DirectoryOrCreate, Directory, FileOrCreate, File, "
        "Socket, CharDevice or BlockDevice. Optional; default: no check.",
    )


class NFSVolumeSource(ApiModel):
    """An NFS export."""

    server: Annotated[
        str, Strict(), Field(min_length=1, max_length=253, pattern=r"^[-.:A-Za-z0-9\[\]]+$")
    ] = Field(description="server is the NFS server's host name or IP address. Required.")
    path: HostPath = Field(description="path is the exported absolute path. Required.")
    read_only: Flag | None = Field(
        default=None, description="readOnly mounts the export read-only. Optional."
    )


class LocalObjectReference(ApiModel):
    """A reference to an object in the job's namespace."""

    name: Name = Field(description="name is the object's name. Required.")


class CSIVolumeSource(ApiModel):
    """An ephemeral volume of a CSI driver."""

    driver: Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=CSI_DRIVER_PATTERN)] = Field(
        description="driver is the CSI driver's name (a DNS subdomain of at most 63 characters). Required."
    )
    read_only: Flag | None = Field(
        default=None, description="readOnly mounts the volume read-only. Optional."
    )
    fs_type: Annotated[str, Strict(), Field(max_length=63, pattern=r"^[a-z0-9]*$")] | None = Field(
        default=None, description="fsType is the file system type (ext4, xfs, ...). Optional."
    )
    volume_attributes: dict[Annotated[str, Strict(), Field(max_length=253)], EnvValue] | None = Field(
        default=None, max_length=32, description="volumeAttributes are the driver's properties. Optional."
    )
    node_publish_secret_ref: LocalObjectReference | None = Field(
        default=None, description="nodePublishSecretRef names the Secret the driver mounts with. Optional."
    )


VOLUME_SOURCES: dict[str, str] = {
    "emptyDir": "empty_dir",
    "configMap": "config_map",
    "secret": "secret",
    "persistentVolumeClaim": "persistent_volume_claim",
    "hostPath": "host_path",
    "nfs": "nfs",
    "csi": "csi",
}


class Volume(ApiModel):
    """An extra pod volume: a name and exactly one of the supported sources."""

    cel_rules = (_exactly_one(VOLUME_SOURCES, "a volume"),)

    name: DnsLabel = Field(description="name is the volume's name, unique among volumes. Required.")
    empty_dir: EmptyDirVolumeSource | None = Field(
        default=None, description="emptyDir is a scratch directory. Optional; one source."
    )
    config_map: ConfigMapVolumeSource | None = Field(
        default=None, description="configMap projects a ConfigMap's keys. Optional; one source."
    )
    secret: SecretVolumeSource | None = Field(
        default=None, description="secret projects a Secret's keys. Optional; one source."
    )
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = Field(
        default=None, description="persistentVolumeClaim mounts a claim. Optional; one source."
    )
    host_path: HostPathVolumeSource | None = Field(
        default=None, description="hostPath mounts a path of the node. Optional; one source."
    )
    nfs: NFSVolumeSource | None = Field(
        default=None, description="nfs mounts an NFS export. Optional; one source."
    )
    csi: CSIVolumeSource | None = Field(
        default=None, description="csi mounts an ephemeral CSI volume. Optional; one source."
    )


class MountPropagation(enum.StrEnum):
    # None: no propagation (the default).
    NONE = "None"
    # HostToContainer: mounts made on the host later appear in the container. (Bidirectional needs a
    # privileged container, which the worker is not.)
    HOST_TO_CONTAINER = "HostToContainer"


class RecursiveReadOnly(enum.StrEnum):
    DISABLED = "Disabled"
    IF_POSSIBLE = "IfPossible"
    ENABLED = "Enabled"


class VolumeMount(ApiModel):
    """A mount of an extra volume into the worker container."""

    cel_rules = (
        CelRule(
            rule="!(has(self.subPath) && has(self.subPathExpr))",
            message="subPath and subPathExpr are mutually exclusive",
            check=lambda s: s.sub_path is None or s.sub_path_expr is None,
            field_path=".subPathExpr",
        ),
        CelRule(
            rule=f"!has(self.subPath) || !{_cel_backstep('self.subPath')}",
            message="subPath must not contain '..' elements",
            check=lambda s: s.sub_path is None or not has_backstep(s.sub_path),
            field_path=".subPath",
        ),
        CelRule(
            rule=f"!has(self.subPathExpr) || !{_cel_backstep('self.subPathExpr')}",
            message="subPathExpr must not contain '..' elements",
            check=lambda s: s.sub_path_expr is None or not has_backstep(s.sub_path_expr),
            field_path=".subPathExpr",
        ),
        CelRule(
            rule=(
                "!has(self.recursiveReadOnly) || self.recursiveReadOnly == 'Disabled' || "
                "(has(self.readOnly) && self.readOnly && "
                "(!has(self.mountPropagation) || self.mountPropagation == 'None'))"
            ),
            message="recursiveReadOnly IfPossible or Enabled needs readOnly true and mountPropagation None",
            check=lambda s: (
                s.recursive_read_only in (None, RecursiveReadOnly.DISABLED)
                or (bool(s.read_only) and s.mount_propagation in (None, MountPropagation.NONE))
            ),
            field_path=".recursiveReadOnly",
        ),
    )

    name: DnsLabel = Field(description="name is the mounted volume's name. Required.")
    mount_path: MountPath = Field(
        description="mountPath is the absolute path it is mounted at, unique among mounts. Required."
    )
    read_only: Flag | None = Field(default=None, description="readOnly mounts it read-only. Optional.")
    sub_path: RelativePath | None = Field(
        default=None,
        description="subPath mounts this relative path of the volume instead of its root. Optional.",
    )
    sub_path_expr: RelativePath | None = Field(
        default=None,
        description="subPathExpr is subPath with $(VAR) references to the container's env. "
        "Optional; not with subPath.",
    )
    mount_propagation: MountPropagation | None = Field(
        default=None, description="mountPropagation is None or HostToContainer. Optional; default: None."
    )
    recursive_read_only: RecursiveReadOnly | None = Field(
        default=None,
        description="recursiveReadOnly is Disabled, IfPossible or Enabled (the last two with "
        "readOnly). Optional; default: Disabled.",
    )


# --- scheduling --------------------------------------------------------------------------------------
class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class NodeSelectorOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class Toleration(ApiModel):
    """A Kubernetes toleration, added to the ones the operator renders."""

    cel_rules = (
        prefix_fits("key", "key"),
        CelRule(
            rule="(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            message="operator must be Exists when key is empty (a toleration of every taint)",
            check=lambda s: bool(s.key) or s.operator == TolerationOperator.EXISTS,
            field_path=".operator",
        ),
        CelRule(
            rule="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            message="value must be empty when operator is Exists",
            check=lambda s: s.operator != TolerationOperator.EXISTS or not s.value,
            field_path=".value",
        ),
        CelRule(
            rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="effect must be NoExecute when tolerationSeconds is set",
            check=lambda s: s.toleration_seconds is None or s.effect == TaintEffect.NO_EXECUTE,
            field_path=".effect",
        ),
    )

    key: (
        Annotated[
            str,
            Strict(),
            Field(max_length=MAX_QUALIFIED_NAME_LENGTH, pattern=rf"^(({_SUBDOMAIN}/)?{_NAME_PART})?$"),
        ]
        | None
    ) = Field(
        default=None,
        description="key is the taint key the toleration matches (a qualified name); empty with operator "
        "Exists matches every taint. Optional.",
    )
    operator: TolerationOperator | None = Field(
        default=None, description="operator is Exists or Equal. Optional; Kubernetes defaults it to Equal."
    )
    value: LabelValue | None = Field(
        default=None, description="value is the taint value matched by Equal (a label value). Optional."
    )
    effect: TaintEffect | None = Field(
        default=None,
        description="effect is NoSchedule, PreferNoSchedule or NoExecute. Optional; empty matches all.",
    )
    toleration_seconds: Annotated[Int64, Field(ge=0)] | None = Field(
        default=None,
        description="tolerationSeconds bounds how long a NoExecute taint is tolerated; only with effect "
        "NoExecute. Optional.",
    )


class NodeSelectorRequirement(ApiModel):
    """One node-label requirement of a node affinity term."""

    cel_rules = (
        prefix_fits("key", "key"),
        CelRule(
            rule=(
                "self.operator in ['In', 'NotIn'] ? self.values.size() > 0 : "
                "(self.operator in ['Exists', 'DoesNotExist'] ? self.values.size() == 0 : "
                "self.values.size() == 1 && self.values[0].matches('^[0-9]{1,18}$'))"
            ),
            message="values must be non-empty for In and NotIn, empty for Exists and DoesNotExist, and one "
            "integer for Gt and Lt",
            check=lambda s: (
                len(s.values) > 0
                if s.operator in (NodeSelectorOperator.IN, NodeSelectorOperator.NOT_IN)
                else len(s.values) == 0
                if s.operator in (NodeSelectorOperator.EXISTS, NodeSelectorOperator.DOES_NOT_EXIST)
                else len(s.values) == 1 and matches(r"^[0-9]{1,18}$", s.values[0])
            ),
            field_path=".values",
        ),
    )

    key: QualifiedName = Field(description="key is the node label key (a qualified name). Required.")
    operator: NodeSelectorOperator = Field(
        description="operator is one of In, NotIn, Exists, DoesNotExist, Gt, Lt. Required."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=64,
        description="values are the label values In/NotIn compare with (at least one), none for "
        "Exists/DoesNotExist, one integer for Gt/Lt. Optional.",
    )


class NodeSelectorTerm(ApiModel):
    """A node selector term: all of its requirements must hold."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        min_length=1,
        max_length=16,
        description="matchExpressions are node-label requirements, all of which must hold. Required.",
    )
