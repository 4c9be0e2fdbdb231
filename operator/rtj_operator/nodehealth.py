"""The operator's node health settings: which signals beyond Ready make a worker's node unfit.

Most p5 hardware faults leave the node Ready (a GPU Xid error, a GPU off the bus, an EFA link
down). They surface as node conditions (node-problem-detector, the EKS node monitoring agent, GPU
health checks), taints, health labels (SageMaker HyperPod), or a device plugin lowering
the node's allocatable GPUs/EFA adapters; the trainer also reports faults it blames on its node.
`NodeHealth` says which of these the operator acts on; `decide.node_problems.node_problem` judges a
node by it.

A cordon and the maintenance tools' taints are no health signal: they are planned disruptions
(`rtj_operator.disruptions`), never a fault. The settings add a site's own planned-disruption signals
to that built-in list: taints and labels that say a node is being taken out on purpose
(`disruptionTaints`, `disruptionLabels`: nothing moves, no new worker goes there), and those that say
it goes within minutes whatever the job does (`noticeTaints`, `noticeLabels`: a spot interruption
notice a site's own handler shows as a label; the node's workers are moved at once).

Every signal has a name (the condition type, the label value, the taint key,
`InsufficientAllocatable`, `TrainerReportedFaults`); it is the reason recorded in
`status.nodeFaults[].lastReason`. Signals named in `permanent` exclude the node for the job at once
(like a deleted node); the others count toward `failurePolicy.repeatOffenderThreshold`.

The settings come from the operator's command line (`--node-health`, a JSON object the Helm chart
renders from its `nodeHealth` values); `parse_node_health` names the field of any bad value.
docs/operations.md ("Node health signals") lists every signal and its default.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from rtj_operator import disruptions
from rtj_operator.validation import format_validation_error

ConditionStatus = Literal["True", "False", "Unknown"]
Name = Annotated[str, Field(min_length=1, max_length=316)]

# Signal names that are not a condition type, label value or taint key.
SIGNAL_INSUFFICIENT_ALLOCATABLE = "InsufficientAllocatable"
SIGNAL_TRAINER_REPORTED = "TrainerReportedFaults"

# Conditions and the status that means unhealthy.
# node-problem-detector's default monitors set these True on a problem.
NPD_CONDITIONS: dict[str, ConditionStatus] = {
    "KernelDeadlock": "True",
    "ReadonlyFilesystem": "True",
    "FrequentKubeletRestart": "True",
    "FrequentDockerRestart": "True",
    "FrequentContainerdRestart": "True",
}
# The EKS node monitoring agent sets one condition per category, False on a problem (with EKS node
# auto repair the node is then rebooted or replaced).
EKS_NODE_MONITORING_CONDITIONS: dict[str, ConditionStatus] = {
    "AcceleratedHardwareReady": "False",
    "NetworkingReady": "False",
    "StorageReady": "False",
    "KernelReady": "False",
    "ContainerRuntimeReady": "False",
}
# SageMaker HyperPod's health label and the values that take a node out of service.
HYPERPOD_HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
HYPERPOD_UNHEALTHY: tuple[str, ...] = (
    "Unschedulable",
    "UnschedulablePendingReplacement",
    "UnschedulablePendingReboot",
)
# Taints (any effect) that say the node is unfit: the cloud node lifecycle controller's taint on an
# instance that is shut down. NoExecute taints the pod does not tolerate are judged anyway
# (decide.node_problems.node_problem); the maintenance tools' taints are planned disruptions, never faults.
DEFAULT_TAINTS = ("node.cloudprovider.kubernetes.io/shutdown",)
DEFAULT_RESOURCES = ("nvidia.com/gpu", "vpc.amazonaws.com/efa")
# Hardware that is broken for good (a GPU error, a GPU gone, a node HyperPod replaces, a node the
# trainer saw fail `trainerFaultThreshold` times): retrying there wastes a restart of the whole job.
DEFAULT_PERMANENT = (
    "AcceleratedHardwareReady",
    "UnschedulablePendingReplacement",
    SIGNAL_INSUFFICIENT_ALLOCATABLE,
    SIGNAL_TRAINER_REPORTED,
)
DEFAULT_TRAINER_FAULT_THRESHOLD = 3


class NodeHealth(BaseModel):
    """What makes a Ready node unfit for a worker (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    conditions: dict[Name, ConditionStatus] = Field(
        default_factory=lambda: {**NPD_CONDITIONS, **EKS_NODE_MONITORING_CONDITIONS},
        description="node condition type -> the status that means unhealthy",
    )
    taints: tuple[Name, ...] = Field(default=DEFAULT_TAINTS, description="taint keys, any effect")
    labels: dict[Name, tuple[Name, ...]] = Field(
        default_factory=lambda: {HYPERPOD_HEALTH_LABEL: HYPERPOD_UNHEALTHY},
        description="label key -> the values that mean unhealthy (empty: any value)",
    )
    replace_on_cordon: bool = Field(
        default=False,
        description="deprecated, no effect: a cordon is a planned disruption (rtj_operator.disruptions); "
        "still accepted so that settings written for older versions keep working",
    )
    resources: tuple[Name, ...] = Field(
        default=DEFAULT_RESOURCES,
        description="resources whose allocatable below a worker's request makes the node unfit",
    )
    trainer_fault_threshold: int = Field(
        default=DEFAULT_TRAINER_FAULT_THRESHOLD,
        ge=0,
        description="faults the trainer blames on its node that make the node unfit (0: ignored)",
    )
    permanent: tuple[Name, ...] = Field(
        default=DEFAULT_PERMANENT, description="signals that exclude the node for the job at once"
    )

    disruption_taints: tuple[Name, ...] = Field(
        default=(),
        description="taint keys (any effect) that mark a planned disruption, beyond the built-in list "
        "(rtj_operator.disruptions): nothing moves, no new worker is placed there, no fault",
    )
    disruption_labels: dict[Name, tuple[Name, ...]] = Field(
        default_factory=dict,
        description="label key -> the values (empty: any value) that mark a planned disruption",
    )
    notice_taints: tuple[Name, ...] = Field(
        default=(),
        description="taint keys that say the node goes within minutes, beyond the termination "
        "handler's spot-itn: its workers are moved at once (checkpoint at SIGTERM), no fault",
    )
    notice_labels: dict[Name, tuple[Name, ...]] = Field(
        default_factory=dict,
        description="label key -> the values (empty: any value) that say the node goes within minutes "
        "(a spot interruption notice shown as a label): its workers are moved at once, no fault",
    )

    def is_permanent(self, signal: str) -> bool:
        return signal in self.permanent

    @cached_property
    def _planned_taints(self) -> frozenset[str]:
        return disruptions.NODE_TAINTS.union(self.disruption_taints, self.notice_taints)

    @cached_property
    def _notice_taints(self) -> frozenset[str]:
        return disruptions.MOVING_TAINTS.union(self.notice_taints)

    def planned_taint(self, keys: Iterable[str]) -> str | None:
        """The first of a node's taint keys that marks a planned disruption (built-in or configured)."""
        return next((key for key in keys if key in self._planned_taints), None)

    def notice_taint(self, keys: Iterable[str]) -> str | None:
        """The first of a node's taint keys that says the node goes within minutes."""
        return next((key for key in keys if key in self._notice_taints), None)

    def planned_label(self, labels: Mapping[str, str]) -> str | None:
        """`key=value` of the first node label that marks a planned disruption (a notice included)."""
        return _first(matching_labels(labels, self.disruption_labels)) or self.notice_label(labels)

    def notice_label(self, labels: Mapping[str, str]) -> str | None:
        """`key=value` of the first node label that says the node goes within minutes."""
        return _first(matching_labels(labels, self.notice_labels))


def matching_labels(
    labels: Mapping[str, str], wanted: Mapping[str, tuple[str, ...]]
) -> Iterator[tuple[str, str]]:
    """(key, value) of each node label, by key, that `wanted` lists with its value (any value, for
    an empty list): the one rule every label setting is judged by."""
    for key, values in sorted(wanted.items()):
        value = labels.get(key)
        if value is not None and (not values or value in values):
            yield key, value


def _first(found: Iterator[tuple[str, str]]) -> str | None:
    key_value = next(found, None)
    return None if key_value is None else f"{key_value[0]}={key_value[1]}"


class NodeHealthError(ValueError):
    """Bad node health settings; the message names the field."""


def parse_node_health(text: str | None) -> NodeHealth:
    """The settings from a JSON object (keys as in the chart's `nodeHealth` values); omitted keys keep
    their defaults, an empty or absent text means every default."""
    if not text or not text.strip():
        return NodeHealth()
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise NodeHealthError(f"--node-health: not JSON: {error}") from error
    if not isinstance(raw, dict):
        raise NodeHealthError("--node-health: expected a JSON object")
    try:
        return NodeHealth.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"nodeHealth.{path}: {message}" for path, message in format_validation_error(error)
        )
        raise NodeHealthError(problems) from error
