"""spec.scheduling: node selection, tolerations, the same topology and gang admission (Kueue or
coscheduling)."""

from __future__ import annotations

from pydantic import Field

from rtj_operator.api.corev1 import (
    QUALIFIED_NAME_LONG_PREFIX,
    DnsLabel,
    LabelValue,
    MapKey,
    NodeSelectorTerm,
    OptionalName,
    QualifiedName,
    Toleration,
    cel_string,
    keys_are_qualified_names,
    matches,
)
from rtj_operator.api.schema import ApiModel, CelRule, Int32
from rtj_operator.api.spec.common import ZONE_LABEL

DEFAULT_COSCHEDULING_SCHEDULER: str = "scheduler-plugins-scheduler"


class KueueAdmission(ApiModel):
    """Admission through Kueue's plain-pod integration, the pods forming one Kueue pod group."""

    queue_name: DnsLabel = Field(
        description="queueName is the Kueue LocalQueue in the job's namespace (the pods' "
        "kueue.x-k8s.io/queue-name label). Required."
    )


class CoschedulingAdmission(ApiModel):
    """A scheduler-plugins coscheduling PodGroup (scheduling.x-k8s.io/v1alpha1), owned by the job."""

    scheduler_name: DnsLabel = Field(
        default=DEFAULT_COSCHEDULING_SCHEDULER,
        description="schedulerName is the scheduler that runs the coscheduling plugin (the pods' "
        f"schedulerName). Optional; default: {DEFAULT_COSCHEDULING_SCHEDULER}.",
    )
    schedule_timeout_seconds: Int32 = Field(
        default=600,
        ge=1,
        le=86400,
        description="scheduleTimeoutSeconds is how long the group's pods wait for all of them to fit "
        "before the plugin rejects the group (it retries later). Optional; default: 600.",
    )


class GangScheduling(ApiModel):
    """All-or-nothing admission of the job's pods: exactly one of the options."""

    cel_rules = (
        CelRule(
            rule="has(self.kueue) != has(self.coscheduling)",
            message="exactly one of kueue, coscheduling must be set",
            check=lambda s: (s.kueue is None) != (s.coscheduling is None),
        ),
    )

    kueue: KueueAdmission | None = Field(
        default=None,
        description="kueue queues the pods as one Kueue pod group (kueue.x-k8s.io/pod-group-name, "
        "kueue.x-k8s.io/pod-group-total-count: workers plus spares). Optional; one of two.",
    )
    coscheduling: CoschedulingAdmission | None = Field(
        default=None,
        description="coscheduling creates a PodGroup with minMember = nodes and labels the pods "
        "scheduling.x-k8s.io/pod-group. Optional; one of two.",
    )


class SchedulingSpec(ApiModel):
    """Where the job's pods may run, in addition to the instance-type affinity the operator renders."""

    cel_rules = (
        keys_are_qualified_names("nodeSelector", "node_selector"),
        CelRule(
            rule=(
                "!has(self.sameTopology) || "
                f"self.sameTopology.all(k, !k.matches({cel_string(QUALIFIED_NAME_LONG_PREFIX)}))"
            ),
            message="every key of sameTopology must be a qualified name (its prefix at most 253 characters)",
            check=lambda s: not any(matches(QUALIFIED_NAME_LONG_PREFIX, k) for k in s.same_topology),
            field_path=".sameTopology",
        ),
    )

    node_selector: dict[MapKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="nodeSelector is added to every pod's nodeSelector; keys are qualified names, values "
        "label values. Optional; default: empty.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "tolerations are added to the rendered ones (nvidia.com/gpu, and node not-ready/unreachable "
            "for failurePolicy.nodeLossGraceSeconds). Optional; default: empty."
        ),
    )
    required_node_affinity_terms: list[NodeSelectorTerm] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "requiredNodeAffinityTerms are node selector terms, one of which a node must satisfy; the "
            "instance-type and excluded-node requirements are added to each. Optional; default: empty."
        ),
    )
    priority_class_name: OptionalName | None = Field(
        default=None, description="priorityClassName is the pods' PriorityClass (a DNS subdomain). Optional."
    )
    same_topology: list[QualifiedName] = Field(
        default_factory=lambda: [ZONE_LABEL],
        max_length=4,
        description=(
            "sameTopology lists node label keys whose value all of the job's pods share (required pod "
            "affinity among the job's pods, one term per key): the scheduler places the first pod, the "
            f"others follow. Default: [{ZONE_LABEL}], since EFA and an FSx for Lustre file system do "
            "not cross availability zones; add a node-group or placement-group label to keep EFA "
            "traffic within one; [] for none. Optional."
        ),
    )
    gang: GangScheduling | None = Field(
        default=None,
        description="gang admits the job's pods all together or not at all: through Kueue or the "
        "scheduler-plugins coscheduling plugin. Optional; default: none.",
    )
