"""spec.instanceType and spec.resources: the known instance types and the overrides of their sizing."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from rtj_operator.api.corev1 import LABEL_VALUE_PATTERN, PositiveQuantity
from rtj_operator.api.schema import ApiModel, Int32

# type is accepted when spec.resources gives at least cpu and memory.
KNOWN_INSTANCE_TYPES: tuple[str, ...] = (
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p4d.24xlarge",
    "cpu",
)


InstanceTypeName = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)]


# Kubernetes refuses a hugepages quantity that is not a whole number of pages (2Mi): written in Mi, Gi or Ti.
HugePages2Mi = Annotated[
    str, Strict(), Field(max_length=32, pattern=r"^(0+(\.0*)?([KMGT]i)?|[0-9]*[02468]Mi|[0-9]+(Gi|Ti))$")
]


class ResourceOverrides(ApiModel):
    """Overrides of the instance profile's pod sizing."""

    gpus: Int32 | None = Field(
        default=None,
        ge=0,
        le=64,
        description="gpus is the nvidia.com/gpu count per pod. Optional; default: the profile's.",
    )
    efa_adapters: Int32 | None = Field(
        default=None,
        ge=0,
        le=64,
        description="efaAdapters is the vpc.amazonaws.com/efa count per pod. "
        "Optional; default: the profile's.",
    )
    cpu: PositiveQuantity | None = Field(
        default=None,
        description="cpu is the CPU request per pod (a positive quantity). Optional; default: the profile's.",
    )
    memory: PositiveQuantity | None = Field(
        default=None,
        description="memory is the memory request and limit per pod (a positive quantity). "
        "Optional; default: the profile's.",
    )
    hugepages2_mi: HugePages2Mi | None = Field(
        default=None,
        alias="hugepages2Mi",
        description=(
            "hugepages2Mi is the hugepages-2Mi request and limit per pod, a whole number of 2Mi pages: "
            'an even number of Mi or a whole number of Gi or Ti ("0" for none). '
            "Optional; default: the profile's."
        ),
    )
    shm_size: PositiveQuantity | None = Field(
        default=None,
        description=(
            "shmSize is the size limit of the memory-backed /dev/shm volume (a positive quantity). "
            "Optional; default: the profile's."
        ),
    )
