"""What the renderer produces under faultTolerance.launcher Supervisor: every worker and spare pod a
member of one world (slot, world size, the store pod's address in its env), and the store pod itself:
small, hardened, resolvable, and never beside a worker or spare."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from rtj_contract import env as env_names
from rtj_operator import api, constants, names, render

UID = "7d0c1d3e-2b8f-4a47-9b59-0b6f1d0c2e5a"
STORE_PORT = 29500


def job(**spec: Any) -> api.ResilientTrainingJob:
    body_spec: dict[str, Any] = {
        "image": "trainer:1",
        "nodes": 3,
        "hotSpares": 2,
        "faultTolerance": {"launcher": "Supervisor"},
        "checkpoint": {"memoryIntervalSteps": 5, "storage": {"dynamic": {}}},
    }
    body_spec.update(spec)
    return api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "llm", "namespace": "ml", "uid": UID},
            "spec": body_spec,
        }
    )


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_every_worker_and_spare_gets_its_slot_in_one_world() -> None:
    the_job = job()
    workers = [env_of(render.render_worker_pod(the_job, i)) for i in range(3)]
    spares = [env_of(render.render_spare_pod(the_job, k)) for k in range(2)]
    for slot, env in enumerate([*workers, *spares]):
        assert env[env_names.LAUNCH_MODE] == "supervisor"
        assert env[env_names.SLOT] == env[env_names.NODE_RANK] == str(slot)
        assert env[env_names.SLOTS] == "5"
        assert env[env_names.NNODES] == "3"
        assert env[env_names.STORE_HOST] == "llm-store.llm.ml.svc"
        assert env[env_names.STORE_PORT] == str(STORE_PORT)
        assert env[env_names.MEMORY_INTERVAL_STEPS] == "5"
        assert env[env_names.INPROCESS_ENABLED] == "true"
    assert [env[env_names.ROLE] for env in [*workers, *spares]] == ["worker"] * 3 + ["spare"] * 2


def test_the_user_env_still_wins_over_the_launcher_variables() -> None:
    the_job = job(env=[{"name": "RTJ_LAUNCH_MODE", "value": "direct"}])
    env = render.render_worker_pod(the_job, 0)["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == env_names.LAUNCH_MODE] == ["direct"]


def test_a_spare_is_a_full_trainer_pod_sized_and_mounted_like_a_worker() -> None:
    the_job = job()
    worker = render.render_worker_pod(the_job, 0)["spec"]
    spare = render.render_spare_pod(the_job, 0)["spec"]
    for key in ("volumes", "securityContext", "tolerations", "affinity", "initContainers"):
        assert spare[key] == worker[key], key
    worker_container, spare_container = worker["containers"][0], spare["containers"][0]
    for key in ("image", "command", "args", "resources", "ports", "volumeMounts", "securityContext"):
        assert spare_container[key] == worker_container[key], key
    assert spare_container["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_children_in_creation_order_put_the_store_pod_before_the_workers() -> None:
    kinds = [(o["kind"], o["metadata"]["name"]) for o in render.render(job())]
    assert kinds[kinds.index(("Service", "llm")) + 1 :] == [
        ("Pod", "llm-store"),
        ("Pod", "llm-worker-0"),
        ("Pod", "llm-worker-1"),
        ("Pod", "llm-worker-2"),
        ("Pod", "llm-spare-0"),
        ("Pod", "llm-spare-1"),
    ]
    assert all(o["metadata"]["name"] != "llm-store" for o in render.render(job(faultTolerance={})))
    with pytest.raises(ValueError, match="not Supervisor"):
        render.render_store_pod(job(faultTolerance={}))


def test_the_store_pod_serves_both_stores_small_and_hardened() -> None:
    pod = render.render_store_pod(job(rendezvous={"port": 31000}))
    kubernetes_validate.validate(pod, "1.32", strict=True)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == names.store_pod_name("llm") == "llm-store"
    assert meta["labels"][constants.LABEL_ROLE] == constants.ROLE_STORE
    assert meta["labels"][constants.LABEL_JOB] == "llm"
    assert meta["ownerReferences"][0]["uid"] == UID and meta["ownerReferences"][0]["controller"]
    assert (spec["hostname"], spec["subdomain"]) == ("llm-store", "llm")
    assert spec["serviceAccountName"] == "llm-trainer" and spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["command"] == ["rtj-store", "--port", "31000"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("store", 31000),
        ("store-groups", 31001),
    ]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 31000}
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "256Mi"},
    }
    hardening = container["securityContext"]
    assert hardening["runAsNonRoot"] and hardening["readOnlyRootFilesystem"]
    assert hardening["capabilities"] == {"drop": ["ALL"]} and hardening["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsUser"] == constants.TRAINER_UID
    # Nothing of a trainer's: no checkpoint volume, no shared memory, no init container, no devices.
    assert [v["name"] for v in spec["volumes"]] == [api.SCRATCH_VOLUME]
    assert "initContainers" not in spec
    env = env_of(pod)
    assert env[env_names.ROLE] == "store" and env[env_names.JOB_UID] == UID


def test_the_store_pod_runs_anywhere_but_beside_the_jobs_workers_and_spares() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    the_job = job(scheduling={"nodeSelector": {"pool": "gpu"}, "tolerations": [toleration]})
    spec = render.render_store_pod(the_job, excluded_nodes=["bad-2", "bad-1"])["spec"]
    # No instance type, zone or user node selector: a CPU node will do.
    assert "nodeSelector" not in spec
    assert spec["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-1", "bad-2"]}
                    ]
                }
            ]
        }
    }
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"] == {
        "matchLabels": {constants.LABEL_JOB: "llm"},
        "matchExpressions": [
            {"key": constants.LABEL_ROLE, "operator": "In", "values": ["worker", "spare", "surge"]}
        ],
    }
    assert "podAffinity" not in spec["affinity"]
    keys = [t["key"] for t in spec["tolerations"]]
    assert "nvidia.com/gpu" not in keys and "dedicated" in keys
    assert {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} <= set(keys)
    assert all(t.get("tolerationSeconds") == 10 for t in spec["tolerations"] if t["key"].startswith("node."))
    assert "schedulerName" not in spec


def test_workers_neither_follow_nor_avoid_the_store_pod_by_their_own_terms() -> None:
    affinity = render.render_worker_pod(job(), 0)["spec"]["affinity"]
    peers = {
        "matchLabels": {constants.LABEL_JOB: "llm"},
        "matchExpressions": [
            {"key": constants.LABEL_ROLE, "operator": "In", "values": ["worker", "spare", "surge"]}
        ],
    }
    for kind in ("podAffinity", "podAntiAffinity"):
        for term in affinity[kind]["requiredDuringSchedulingIgnoredDuringExecution"]:
            assert term["labelSelector"] == peers, kind


def test_the_service_gives_the_store_pod_its_name_and_both_ports() -> None:
    service = render.render_service(job())
    assert service["spec"]["selector"] == {constants.LABEL_JOB: "llm"}
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("store", 29500),
        ("store-groups", 29501),
    ]
    store_labels = render.render_store_pod(job())["metadata"]["labels"]
    assert all(store_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    # FtLauncher keeps its Service: the workers only, the rendezvous port.
    plain = render.render_service(job(faultTolerance={}))
    assert plain["spec"]["selector"] == {constants.LABEL_JOB: "llm", constants.LABEL_ROLE: "worker"}


def test_the_store_pod_stays_out_of_the_gang() -> None:
    the_job = job(scheduling={"gang": {"kueue": {"queueName": "q"}}})
    store = render.render_store_pod(the_job)
    assert constants.LABEL_KUEUE_QUEUE not in store["metadata"]["labels"]
    worker = render.render_worker_pod(the_job, 0)
    assert worker["metadata"]["annotations"][constants.ANNOTATION_KUEUE_POD_GROUP_TOTAL] == "5"


def test_do_not_disrupt_covers_the_spares_that_run_ranks_and_the_store_pod() -> None:
    the_job = job(disruption={"doNotDisrupt": True})
    pods = (
        render.render_worker_pod(the_job, 0),
        render.render_spare_pod(the_job, 1),
        render.render_store_pod(the_job),
    )
    for pod in pods:
        assert pod["metadata"]["annotations"][constants.ANNOTATION_DO_NOT_DISRUPT] == "true"
    assert "annotations" not in render.render_store_pod(job())["metadata"]
    plain = job(disruption={"doNotDisrupt": True}, faultTolerance={})
    assert constants.ANNOTATION_DO_NOT_DISRUPT not in render.render_spare_pod(plain, 0)["metadata"].get(
        "annotations", {}
    )
