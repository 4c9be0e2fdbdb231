"""The opt-in children (PodDisruptionBudget, coscheduling PodGroup) as the operator creates them: in
the base it asserts before pods, through resources its client knows and RBAC it declares; a PodGroup
on a cluster without the scheduler-plugins CRD (HTTP 404) is a refusal, not a retry loop."""

from __future__ import annotations

from typing import Any

from operator_world import T0
from rtj_operator import api, decide, events, render
from rtj_operator.decide import conditions as cond
from rtj_operator.decide.admission import PERMANENT_CODES
from rtj_operator.runtime.kube import REQUIRED_PERMISSIONS, RESOURCES

UID = "0b6f1d0c-2e5a-4a47-9b59-7d0c1d3e2b8f"


def job(**spec: Any) -> api.ResilientTrainingJob:
    return api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "train", "namespace": "ml", "uid": UID},
            "spec": {
                "image": "trainer:1",
                "nodes": 2,
                "checkpoint": {"storage": {"dynamic": {}}},
                **spec,
            },
        }
    )


def test_opt_in_children_are_created_with_the_base_through_known_resources_and_permissions() -> None:
    j = job(
        disruption={"podDisruptionBudget": {"maxUnavailable": 1}},
        scheduling={"gang": {"coscheduling": {}}},
    )
    base = render.render_base(j, uid=UID)
    optional = [o for o in base if o["kind"] in ("PodDisruptionBudget", "PodGroup")]
    assert [o["kind"] for o in optional] == ["PodDisruptionBudget", "PodGroup"]
    for obj in optional:
        resource = RESOURCES[obj["kind"]]
        assert obj["apiVersion"] == f"{resource.group}/{resource.version}"
        assert (resource.group, resource.plural, "create") in REQUIRED_PERMISSIONS


def test_a_kind_the_cluster_does_not_serve_is_a_rejected_child() -> None:
    assert 404 in PERMANENT_CODES
    refusal = decide.Refusal(
        "PodGroup", "train", 404, "NotFound", "the server could not find the requested resource"
    )
    status, changed, emitted = decide.record_refusal({}, 1, refusal, T0)
    blocked = status["conditions"][0]
    assert changed and (blocked["type"], blocked["status"]) == (cond.COND_BLOCKED, "True")
    assert blocked["reason"] == events.CHILD_REJECTED and "could not find" in blocked["message"]
    assert [(e.type, e.reason) for e in emitted] == [(events.WARNING, events.CHILD_REJECTED)]
