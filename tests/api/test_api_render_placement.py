"""What the renderer produces for placement, disruptions, gang admission and checkpoint ownership: one
zone for the job's pods (FSx's zone when given), karpenter's do-not-disrupt, the workers'
PodDisruptionBudget, Kueue pod groups or a coscheduling PodGroup, the pods' user and fsGroup, and the
init container that gives the job its checkpoint directory."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from rtj_operator import api, constants, names, render
from test_api_render import UID, by_kind_name, job

ZONE = "topology.kubernetes.io/zone"


def worker(j: api.ResilientTrainingJob, index: int = 0) -> dict[str, Any]:
    return render.render_worker_pod(j, index, uid=UID)


def node_requirements(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in terms["nodeSelectorTerms"]]


def fsx(**extra: Any) -> dict[str, Any]:
    return {
        "storage": {
            "fsxStatic": {
                "fileSystemId": "fs-0123456789abcdef0",
                "dnsName": "fs.x",
                "mountName": "mnt",
                **extra,
            }
        }
    }


def test_pods_share_one_zone_by_default_through_pod_affinity_among_the_jobs_pods() -> None:
    j = job(hotSpares=1)
    for pod in (worker(j), render.render_spare_pod(j, 0, uid=UID)):
        terms = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        # Worker and spare alike: a spare that takes over must be in the workers' zone.
        assert terms == [
            {"labelSelector": {"matchLabels": {constants.LABEL_JOB: "llm"}}, "topologyKey": ZONE}
        ]
    # Without a zone given, the node affinity does not name one: the scheduler picks it for the first pod.
    assert all(req["key"] != ZONE for term in node_requirements(worker(j)) for req in term)


def test_same_topology_takes_more_keys_or_none() -> None:
    group = "eks.amazonaws.com/nodegroup"
    terms = worker(job(scheduling={"sameTopology": [ZONE, group]}))["spec"]["affinity"]["podAffinity"]
    keys = [t["topologyKey"] for t in terms["requiredDuringSchedulingIgnoredDuringExecution"]]
    assert keys == [ZONE, group]
    assert "podAffinity" not in worker(job(scheduling={"sameTopology": []}))["spec"]["affinity"]


def test_fsx_zone_is_required_of_every_pod_and_of_the_volume() -> None:
    j = job(checkpoint=fsx(availabilityZone="us-east-1a"), scheduling={"requiredNodeAffinityTerms": [
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "b", "operator": "Exists"}]},
    ]})  # fmt: skip
    zone = {"key": ZONE, "operator": "In", "values": ["us-east-1a"]}
    # In every ORed term, since a node may satisfy any one of them.
    assert all(zone in term for term in node_requirements(worker(j)))
    pv = by_kind_name(render.render_storage(j, uid=UID))[("PersistentVolume", "llm-checkpoints-ml")]
    assert pv["spec"]["nodeAffinity"] == {"required": {"nodeSelectorTerms": [{"matchExpressions": [zone]}]}}
    assert (
        "nodeAffinity"
        not in by_kind_name(render.render_storage(job(), uid=UID))[
            ("PersistentVolume", "llm-checkpoints-ml")
        ]["spec"]
    )


def test_do_not_disrupt_annotates_workers_only_and_keeps_user_annotations() -> None:
    j = job(hotSpares=1, podAnnotations={"team": "a"}, disruption={"doNotDisrupt": True})
    assert worker(j)["metadata"]["annotations"] == {"team": "a", "karpenter.sh/do-not-disrupt": "true"}
    assert render.render_spare_pod(j, 0, uid=UID)["metadata"]["annotations"] == {"team": "a"}
    assert "annotations" not in worker(job())["metadata"]


def test_pod_disruption_budget_is_opt_in_owned_and_selects_the_workers() -> None:
    assert render.render_pod_disruption_budget(job(), uid=UID) is None
    assert all(o["kind"] != "PodDisruptionBudget" for o in render.render(job(), uid=UID))
    j = job(disruption={"podDisruptionBudget": {"maxUnavailable": 1}})
    pdb = by_kind_name(render.render_base(j, uid=UID))[("PodDisruptionBudget", "llm-workers")]
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == UID
    # minAvailable = nodes - maxUnavailable: a maxUnavailable budget over a custom resource's pods
    # cannot sync (the disruption controller needs a scale subresource) and refuses every eviction.
    assert pdb["spec"]["minAvailable"] == j.spec.nodes - 1 and "maxUnavailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == {constants.LABEL_JOB: "llm", constants.LABEL_ROLE: constants.ROLE_WORKER}
    # The selector matches the workers' labels and not the spares'.
    spare = render.render_spare_pod(job(hotSpares=1), 0, uid=UID)
    assert selector.items() <= worker(j)["metadata"]["labels"].items()
    assert not selector.items() <= spare["metadata"]["labels"].items()
    default = job(disruption={"podDisruptionBudget": {}})
    assert render.render_pod_disruption_budget(default, uid=UID)["spec"]["minAvailable"] == default.spec.nodes
    everything = job(disruption={"podDisruptionBudget": {"maxUnavailable": 100}})
    assert render.render_pod_disruption_budget(everything, uid=UID)["spec"]["minAvailable"] == 0


def test_kueue_gang_labels_every_pod_into_one_group_of_workers_and_spares() -> None:
    j = job(hotSpares=2, scheduling={"gang": {"kueue": {"queueName": "team-a"}}})
    for pod in (worker(j), worker(j, 2), render.render_spare_pod(j, 1, uid=UID)):
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/pod-group-name"] == "llm"
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "5"
        assert "schedulerName" not in pod["spec"]
    # Kueue needs no object of ours.
    assert {o["kind"] for o in render.render_base(j, uid=UID)}.isdisjoint({"PodGroup", "PodDisruptionBudget"})


def test_coscheduling_gang_renders_an_owned_pod_group_and_labels_pods_for_its_scheduler() -> None:
    j = job(hotSpares=1, scheduling={"gang": {"coscheduling": {"scheduleTimeoutSeconds": 120}}})
    group = by_kind_name(render.render_base(j, uid=UID))[("PodGroup", "llm")]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 3, "scheduleTimeoutSeconds": 120}
    assert group["metadata"]["ownerReferences"][0]["uid"] == UID
    for pod in (worker(j), render.render_spare_pod(j, 0, uid=UID)):
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "llm"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    named = job(scheduling={"gang": {"coscheduling": {"schedulerName": "gang"}}})
    assert worker(named)["spec"]["schedulerName"] == "gang"


@pytest.mark.parametrize(
    ("gang", "field"),
    [
        ({}, "spec.scheduling.gang"),
        ({"kueue": {"queueName": "q"}, "coscheduling": {}}, "spec.scheduling.gang"),
    ],
)
def test_gang_takes_exactly_one_option(gang: dict[str, Any], field: str) -> None:
    with pytest.raises(api.JobValidationError, match="exactly one of kueue, coscheduling") as error:
        job(scheduling={"gang": gang})
    assert field in str(error.value)


def test_pods_run_as_the_trainer_user_with_its_fs_group() -> None:
    assert worker(job())["spec"]["securityContext"] == {
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_init_container_gives_the_jobs_checkpoint_directory_to_the_trainer_user() -> None:
    j = job(checkpoint={**fsx(), "mountPath": "/ckpt"})
    pod = worker(j)
    (init,) = pod["spec"]["initContainers"]
    assert init["name"] == names.CHECKPOINT_INIT_CONTAINER_NAME
    assert init["image"] == "trainer:1"
    assert init["command"] == ["rtj-launch", "--prepare-checkpoint-dir"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env == {"RTJ_CHECKPOINT_DIR": "/ckpt/llm", "RTJ_CHECKPOINT_DIR_OWNER": "10001:10001"}
    # It mounts the checkpoint volume only, and holds no capability beyond changing an owner.
    assert init["volumeMounts"] == [{"name": api.CHECKPOINT_VOLUME, "mountPath": "/ckpt"}]
    context = init["securityContext"]
    assert context["runAsUser"] == 0 and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    # The trainer container writes where the init container prepared.
    trainer_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert trainer_env["RTJ_CHECKPOINT_DIR"] == env["RTJ_CHECKPOINT_DIR"]
    off = job(checkpoint={**fsx(), "prepareDirectory": False})
    assert "initContainers" not in worker(off)["spec"]


def test_termination_message_path_is_told_to_the_trainer() -> None:
    container = worker(job())["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (
        env["RTJ_TERMINATION_MESSAGE_PATH"] == container["terminationMessagePath"] == "/dev/termination-log"
    )


def test_default_grace_period_leaves_time_for_a_drain_checkpoint() -> None:
    assert worker(job())["spec"]["terminationGracePeriodSeconds"] == 180
    assert worker(job(terminationGracePeriodSeconds=600))["spec"]["terminationGracePeriodSeconds"] == 600


def test_every_option_renders_children_valid_for_kubernetes() -> None:
    j = job(
        hotSpares=1,
        checkpoint=fsx(availabilityZone="us-west-2b"),
        disruption={"doNotDisrupt": True, "podDisruptionBudget": {"maxUnavailable": 1}},
        scheduling={
            "gang": {"kueue": {"queueName": "q"}},
            "sameTopology": [ZONE, "eks.amazonaws.com/nodegroup"],
        },
    )
    for obj in render.render(j, uid=UID):
        kubernetes_validate.validate(obj, "1.32", strict=True)
