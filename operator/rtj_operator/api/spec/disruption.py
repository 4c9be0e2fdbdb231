"""spec.disruption: planned disruptions (do-not-disrupt, the workers' PodDisruptionBudget, moving on a
notice, surge pods)."""

from __future__ import annotations

from pydantic import Field

from rtj_operator.api.schema import ApiModel, Flag, Int32


class PodDisruptionBudgetSpec(ApiModel):
    """A PodDisruptionBudget over the job's worker pods."""

    max_unavailable: Int32 = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "maxUnavailable is how many workers voluntary evictions (node drains, Karpenter consolidation) "
            "may take at once; 0 blocks them until the job ends or the budget is removed. Optional; "
            "default: 0."
        ),
    )


class DisruptionSpec(ApiModel):
    """How the job meets voluntary disruptions: drains, consolidation, preemption."""

    do_not_disrupt: Flag = Field(
        default=False,
        description='doNotDisrupt annotates the worker pods karpenter.sh/do-not-disrupt: "true" (the '
        "spare pods and the store pod too under faultTolerance.launcher Supervisor), so "
        "Karpenter does not consolidate or expire their nodes. Optional; default: false.",
    )
    pod_disruption_budget: PodDisruptionBudgetSpec | None = Field(
        default=None,
        description="podDisruptionBudget makes the operator create a PodDisruptionBudget over the workers "
        "(owned by the job). Optional; default: none (a drain evicts workers, and each saves a checkpoint "
        "on SIGTERM).",
    )
    move_on_notice: Flag = Field(
        default=False,
        description="moveOnNotice moves a worker as soon as its node shows a planned disruption (a cordon, "
        "Karpenter's, the AWS Node Termination Handler's or the cluster autoscaler's taint): it saves a "
        "checkpoint on SIGTERM and its replacement goes to another node before the eviction comes. "
        "Optional; default: false (the worker stays until it is evicted; a spot interruption notice moves "
        "it either way).",
    )
    surge: Flag = Field(
        default=True,
        description="surge creates a surge pod <job>-surge-<i> as soon as worker i's pod is deleted with a "
        "grace period on a node that is not lost (a drain, an eviction, a move on notice) and no ready hot "
        "spare can take its place: it holds no rank and asks for the replacement's node (scheduling, node "
        "provisioning, the image pull) while the old pod still saves its checkpoint; once the old pod is "
        "gone the replacement is pinned to the surge pod's node if it runs there, and the surge pod is "
        "deleted. Never where the spares take part in the training (faultTolerance.launcher Supervisor, "
        "rendezvous.spares Standby) nor with scheduling.gang. Optional; default: true (a surge asks earlier "
        "for the node the replacement would ask for anyway; false: the replacement asks once the old pod "
        "is gone).",
    )
