"""Instance profiles: how big a job's pods are on each known instance type.

:func:`resolve_sizing` combines a built-in profile with the job's ``spec.resources`` overrides into the
:class:`Sizing` that :mod:`rtj_operator.render` puts on every worker and spare pod (a spare holds a
whole node, so it is sized like a worker). GPU, EFA, hugepages and memory requests equal their limits
(Guaranteed-style for the resources that matter to NCCL/EFA); CPU is requested without a limit so the
data loaders are never throttled by CFS quotas.

Figures: p5/p5e have 8 GPUs, 32 EFA adapters, 192 vCPUs and 2 TiB; p5en 16 EFA (EFAv3) adapters;
p4d 8 A100, 4 EFA adapters, 96 vCPUs, 1152 GiB. The requests leave room for the kubelet, the
daemonsets and the EFA/NVIDIA device plugins (the AWS NVRx sample uses 90-180 CPUs and 900-1800Gi);
``hugepages-2Mi: 5120Mi`` follows AWS's EFA manifests. ``cpu`` is the local cluster's simulated node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rtj_operator.api import KNOWN_INSTANCE_TYPES, ResilientTrainingJobSpec, ResourceOverrides

__all__ = [
    "EFA_RESOURCE",
    "GPU_RESOURCE",
    "HUGEPAGES_RESOURCE",
    "PROFILES",
    "Sizing",
    "processes_per_node",
    "resolve_sizing",
]

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
HUGEPAGES_RESOURCE = "hugepages-2Mi"


@dataclass(frozen=True)
class Sizing:
    """Per-pod resources: counts and Kubernetes quantity strings (``hugepages_2mi`` None means none)."""

    gpus: int
    efa_adapters: int
    cpu: str
    memory: str
    hugepages_2mi: str | None
    shm_size: str


PROFILES: dict[str, Sizing] = {
    "p5.48xlarge": Sizing(
        gpus=8, efa_adapters=32, cpu="180", memory="1800Gi", hugepages_2mi="5120Mi", shm_size="128Gi"
    ),
    "p5e.48xlarge": Sizing(
        gpus=8, efa_adapters=32, cpu="180", memory="1800Gi", hugepages_2mi="5120Mi", shm_size="128Gi"
    ),
    "p5en.48xlarge": Sizing(
        gpus=8, efa_adapters=16, cpu="180", memory="1800Gi", hugepages_2mi="5120Mi", shm_size="128Gi"
    ),
    "p4d.24xlarge": Sizing(
        gpus=8, efa_adapters=4, cpu="90", memory="1000Gi", hugepages_2mi="5120Mi", shm_size="64Gi"
    ),
    # Small enough that several simulated nodes fit on a laptop; gloo, no devices.
    "cpu": Sizing(gpus=0, efa_adapters=0, cpu="250m", memory="2Gi", hugepages_2mi=None, shm_size="256Mi"),
}

# Instance types without a profile start from nothing: the API requires resources.cpu and .memory.
_UNKNOWN = Sizing(gpus=0, efa_adapters=0, cpu="0", memory="0", hugepages_2mi=None, shm_size="1Gi")

assert set(PROFILES) == set(KNOWN_INSTANCE_TYPES), "api.KNOWN_INSTANCE_TYPES and PROFILES must agree"


def _is_zero(quantity: str) -> bool:
    """ "0", "0Mi", "0.0Gi": no hugepages at all (a zero request would still be rendered otherwise)."""
    return re.fullmatch(r"[+-]?0*(\.0*)?([a-zA-Z]+)?", quantity) is not None and any(
        c == "0" for c in quantity
    )


def resolve_sizing(instance_type: str, overrides: ResourceOverrides | None = None) -> Sizing:
    """The pod sizing for an instance type, with the job's overrides applied field by field."""
    base = PROFILES.get(instance_type, _UNKNOWN)
    if overrides is None:
        return base
    hugepages = base.hugepages_2mi if overrides.hugepages2_mi is None else overrides.hugepages2_mi
    return Sizing(
        gpus=base.gpus if overrides.gpus is None else overrides.gpus,
        efa_adapters=base.efa_adapters if overrides.efa_adapters is None else overrides.efa_adapters,
        cpu=overrides.cpu or base.cpu,
        memory=overrides.memory or base.memory,
        hugepages_2mi=None if hugepages is None or _is_zero(hugepages) else hugepages,
        shm_size=overrides.shm_size or base.shm_size,
    )


def processes_per_node(spec: ResilientTrainingJobSpec) -> int:
    """spec.processesPerNode, or one process per GPU, or 1 where the pods have no GPUs."""
    if spec.processes_per_node is not None:
        return spec.processes_per_node
    return resolve_sizing(spec.instance_type, spec.resources).gpus or 1
