"""What the renderer produces under FtLauncher with rendezvous.host StorePod: a store pod that hosts
ft_launcher's rendezvous (one port, the rendezvous' id and node count on its command line), and
workers that dial it, none of them its host."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from rtj_contract import env as env_names
from rtj_operator import api, constants, render
from test_api_render_supervisor import UID, env_of
from test_api_render_supervisor import job as supervisor_job

STORE_RENDEZVOUS: dict[str, Any] = {
    "faultTolerance": {},
    "hotSpares": 1,
    "rendezvous": {"host": "StorePod", "port": 31000},
}


def job(**spec: Any) -> api.ResilientTrainingJob:
    """The Supervisor tests' job, but under FtLauncher with the rendezvous in the store pod."""
    return supervisor_job(**{**STORE_RENDEZVOUS, **spec})


def test_the_default_is_worker_zero_and_no_store_pod() -> None:
    plain = job(rendezvous={})
    assert plain.spec.rendezvous.host is api.RendezvousHost.WORKER0 and not render.has_store_pod(plain)
    kinds = [(c["kind"], c["metadata"]["name"]) for c in render.render(plain)]
    assert ("Pod", "llm-store") not in kinds
    assert env_of(render.render_worker_pod(plain, 1))[env_names.RDZV_HOST] == "llm-worker-0.llm.ml.svc"


def test_the_store_pod_hosts_the_rendezvous_on_one_port() -> None:
    the_job = job()
    assert render.has_store_pod(the_job)
    pods = [c["metadata"]["name"] for c in render.render(the_job) if c["kind"] == "Pod"]
    assert pods == ["llm-store", "llm-worker-0", "llm-worker-1", "llm-worker-2", "llm-spare-0"]
    store = render.render_store_pod(the_job)
    kubernetes_validate.validate(store, "1.32", strict=True)
    (container,) = store["spec"]["containers"]
    assert container["command"] == ["rtj-store", "--port", "31000", "--rendezvous-id", UID, "--nnodes", "3"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("store", 31000)]
    # Never beside a worker, spare or surge pod, as under Supervisor.
    terms = store["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0]["labelSelector"]["matchExpressions"][0]["values"] == ["worker", "spare", "surge"]


def test_every_worker_dials_the_store_pod_and_ft_launchers_own_variables_stay() -> None:
    the_job = job()
    store_host = "llm-store.llm.ml.svc"
    for index in range(3):
        env = env_of(render.render_worker_pod(the_job, index))
        assert env[env_names.RDZV_HOST] == env[env_names.STORE_HOST] == store_host
        assert env[env_names.RDZV_PORT] == env[env_names.STORE_PORT] == "31000"
        assert env_names.LAUNCH_MODE not in env and env_names.SLOT not in env
        assert env[env_names.NODE_RANK] == str(index)
    spare = env_of(render.render_spare_pod(the_job, 0))
    assert spare[env_names.RDZV_HOST] == store_host and env_names.NODE_RANK not in spare


def test_the_service_names_the_store_pod_and_its_port() -> None:
    service = render.render_service(job())
    assert service["spec"]["selector"] == {constants.LABEL_JOB: "llm"}
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("store", 31000)]


def test_do_not_disrupt_covers_the_store_pod_but_not_ft_launchers_spares() -> None:
    the_job = job(disruption={"doNotDisrupt": True})
    store = render.render_store_pod(the_job)
    assert store["metadata"]["annotations"][constants.ANNOTATION_DO_NOT_DISRUPT] == "true"
    spare = render.render_spare_pod(the_job, 0)
    assert constants.ANNOTATION_DO_NOT_DISRUPT not in spare["metadata"].get("annotations", {})


def test_the_api_server_schema_takes_the_field_and_refuses_another_value() -> None:
    schema = api.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    host = schema["properties"]["spec"]["properties"]["rendezvous"]["properties"]["host"]
    assert host["enum"] == ["Worker0", "StorePod"] and host["default"] == "Worker0"


STANDBY: dict[str, Any] = {"host": "StorePod", "port": 31000, "spares": "Standby"}


def test_standby_spares_join_the_rendezvous_after_the_workers_and_the_store_counts_them() -> None:
    the_job = job(hotSpares=2, rendezvous=STANDBY)
    assert render.spares_in_training(the_job) and render.nnodes_max(the_job) == 5
    for index in range(3):
        env = env_of(render.render_worker_pod(the_job, index))
        assert (env[env_names.NODE_RANK], env[env_names.NNODES], env[env_names.NNODES_MAX]) == (
            str(index),
            "3",
            "5",
        )
    for index in range(2):
        # A spare's node rank is its infrastructure rank in the rendezvous: after the workers'.
        env = env_of(render.render_spare_pod(the_job, index))
        assert (env[env_names.ROLE], env[env_names.NODE_RANK], env[env_names.NNODES_MAX]) == (
            "spare",
            str(3 + index),
            "5",
        )
        assert env_names.LAUNCH_MODE not in env  # ft_launcher's, as a worker's
    (container,) = render.render_store_pod(the_job)["spec"]["containers"]
    assert container["command"][-4:] == ["--nnodes", "3", "--nnodes-max", "5"]


def test_spares_holding_nodes_stay_outside_the_rendezvous() -> None:
    the_job = job(hotSpares=2)
    assert the_job.spec.rendezvous.spares is api.SpareMode.HOLD_NODE and not render.spares_in_training(
        the_job
    )
    assert env_of(render.render_worker_pod(the_job, 0))[env_names.NNODES_MAX] == "3"
    (container,) = render.render_store_pod(the_job)["spec"]["containers"]
    assert "--nnodes-max" not in container["command"]


def test_do_not_disrupt_covers_standby_spares_which_may_be_training() -> None:
    the_job = job(rendezvous=STANDBY, disruption={"doNotDisrupt": True})
    spare = render.render_spare_pod(the_job, 0)
    assert spare["metadata"]["annotations"][constants.ANNOTATION_DO_NOT_DISRUPT] == "true"
