"""The `kubernetes-only` mode: the hand-rolled Indexed Job, and a run recovered by Kubernetes alone."""

import uuid
from pathlib import Path

import pytest
from rtj_contract import env as env_names
from rtj_demo import bench, indexedjob, processes
from rtj_demo.indexedjob import (
    COMPLETION_INDEX_ANNOTATION,
    CONTROLLER_UID_LABEL,
    JOB_NAME_LABEL,
    SeenPod,
    backoff_allowance_seconds,
    indexed_job_objects,
    job_state,
    recoveries_from_pods,
)
from rtj_demo.rehearsal import JobSettings, PlannedFault, Stack, build_job, load_example, run_job
from rtj_demo.report import LAYER_JOB_CONTROLLER
from rtj_operator import constants
from rtj_operator.render import NODE_LOSS_TAINTS


def _objects(name: str = "kjob") -> list[dict]:
    settings = JobSettings(
        name=name,
        steps=50,
        checkpoint_interval=10,
        in_process=False,
        max_in_job_restarts=0,
        max_node_replacements=12,
        plan=[PlannedFault("exception", 15, rank=1)],
    )
    return indexed_job_objects(build_job(load_example(), settings, rendezvous_port=31000))


def _env(job: dict) -> dict[str, dict]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def test_the_hand_rolled_job_is_an_indexed_job_with_the_renderers_children() -> None:
    objects = _objects()
    assert [o["kind"] for o in objects] == ["ServiceAccount", "PersistentVolumeClaim", "Service", "Job"]
    job = objects[-1]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 12  # the operator's replacement budget
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == "kjob" and "hostname" not in pod
    assert pod["serviceAccountName"] == "kjob-trainer"
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == ["kjob-checkpoints"] == [objects[1]["metadata"]["name"]]
    # Kubernetes' default tolerations of a lost node, not the operator's short ones.
    assert not {t.get("key") for t in pod.get("tolerations", [])} & set(NODE_LOSS_TAINTS)
    service = objects[2]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"] == {JOB_NAME_LABEL: "kjob"}
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["labelSelector"]["matchLabels"] for t in anti] == [{JOB_NAME_LABEL: "kjob"}]


def test_nothing_of_the_operator_is_left_in_the_hand_rolled_job() -> None:
    for obj in _objects():
        meta = obj["metadata"]
        assert "ownerReferences" not in meta
        assert not [k for k in meta.get("labels", {}) if k.startswith(constants.GROUP)]
        assert constants.LABEL_MANAGED_BY not in meta.get("labels", {})
    template = _objects()[-1]["spec"]["template"]["metadata"]
    assert not [k for k in template.get("labels", {}) if k.startswith(constants.GROUP)]


def test_rank_rendezvous_and_id_come_from_the_job_controller() -> None:
    env = _env(_objects()[-1])
    rank = env[env_names.NODE_RANK]["valueFrom"]["fieldRef"]["fieldPath"]
    assert rank == f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
    assert env[env_names.RDZV_HOST]["value"] == "kjob-0.kjob.default.svc"
    uid = env[env_names.JOB_UID]["valueFrom"]["fieldRef"]["fieldPath"]
    assert uid == f"metadata.labels['{CONTROLLER_UID_LABEL}']"
    # Kubernetes is the only layer: no in-process restart, no in-job restart.
    assert env[env_names.INPROCESS_ENABLED]["value"] == "false"
    assert env[env_names.MAX_RESTARTS]["value"] == "0"
    assert env["RTJ_FAULTS"]["value"] == "exception@step=15,rank=1"


def test_recoveries_are_the_pods_created_after_each_index_first() -> None:
    pods = [
        SeenPod("j-0-a", 0, 10.0),
        SeenPod("j-1-a", 1, 10.0),
        SeenPod("j-0-b", 0, 50.0),
        SeenPod("j-1-b", 1, 51.0),
        SeenPod("j-1-c", 1, 120.0),
    ]
    recoveries = recoveries_from_pods(pods)
    assert [(r.time, r.layer) for r in recoveries] == [
        (50.0, LAYER_JOB_CONTROLLER),
        (51.0, LAYER_JOB_CONTROLLER),
        (120.0, LAYER_JOB_CONTROLLER),
    ]
    assert recoveries_from_pods(pods[:2]) == []


def test_job_state_follows_the_terminal_conditions() -> None:
    assert job_state({}) == "Pending"
    assert job_state({"active": 2}) == "Running"
    assert job_state({"active": 0, "conditions": [{"type": "Complete", "status": "True"}]}) == "Succeeded"
    assert job_state({"conditions": [{"type": "Failed", "status": "True"}]}) == "Failed"
    assert job_state({"active": 1, "conditions": [{"type": "Failed", "status": "False"}]}) == "Running"


def test_back_off_allowance_doubles_per_failure_up_to_the_cap() -> None:
    # Two pods fail per fault: delays of 20 s, 80 s, 320 s, then the 600 s cap; a node loss adds the
    # cloud controller's period and pod GC's quarantine and loop.
    assert backoff_allowance_seconds(1, 2, 0) == 20.0
    assert backoff_allowance_seconds(5, 2, 0) == 20 + 80 + 320 + 600 + 600
    assert backoff_allowance_seconds(1, 1, 1) == 10.0 + 5.0 + 80.0


@pytest.mark.slow
def test_kubernetes_only_run_is_recovered_by_the_job_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short job and a lost node, no operator: the Job controller recreates the pods (the survivor's
    failed too: its peer is gone), the lost Node is deleted and pod GC frees its pod, and the figures
    are computed. One fault: what a second costs under the Job controller's back-off is a figure
    `rtj bench goodput --modes kubernetes-only` measures (docs/benchmarks.md), not a behaviour."""
    run_id = uuid.uuid4().hex
    monkeypatch.setenv(processes.RUN_TAG, run_id)
    mode = bench.MODES["kubernetes-only"]
    plan = [PlannedFault("node-loss", 15)]
    settings = JobSettings(
        name="konly",
        steps=25,
        checkpoint_interval=10,
        checkpoint_mode=mode.checkpoint_mode,
        in_process=mode.in_process,
        max_in_job_restarts=mode.max_in_job_restarts,
        plan=plan,
        extra_args=["--step-sleep", "0.15"],
    )
    notes: list[str] = []
    try:
        with Stack(nodes=bench.cluster_nodes([mode], plan, 2), out_dir=tmp_path, operator=False) as stack:
            assert stack.operator is None
            nodes_before = {n.metadata.name for n in stack.core.list_node().items}
            driver = indexedjob.IndexedJob(stack, settings.name)
            timeout = bench.run_timeout(mode, plan, 2, 600.0)
            result = run_job(stack, settings, timeout=timeout, on_note=notes.append, driver=driver)
            pods = stack.core.list_namespaced_pod("default", label_selector=driver.label_selector).items
            owners = {(o.kind, o.name) for p in pods for o in (p.metadata.owner_references or [])}
            nodes_after = {n.metadata.name for n in stack.core.list_node().items}
            assert stack.get_job(settings.name) is None  # no ResilientTrainingJob was ever made
            indexedjob.delete_indexed_job(stack, settings.name)
            assert not stack.core.list_namespaced_pod("default", label_selector=driver.label_selector).items
    finally:
        leftovers = processes.reap(run_id)
    assert result.finished, f"{result.state}: {result.message}; notes: {notes}"
    assert not leftovers, processes.describe(leftovers)
    assert [m["kind"] for m in result.manifests] == [
        "ServiceAccount",
        "PersistentVolumeClaim",
        "Service",
        "Job",
    ]
    # The pods are the Job's, and the Job controller made more of them than the two indexes.
    assert owners == {("Job", settings.name)}
    creations = [e for e in result.events if e.get("reason") == "SuccessfulCreate"]
    assert creations and all((e.get("source") or {}).get("component") == "job-controller" for e in creations)
    assert len(driver.pods) > 2
    assert {p.index for p in driver.pods.values()} == {0, 1}
    # The lost node's Node object was deleted (as the cloud node lifecycle controller does).
    assert len(nodes_before - nodes_after) == 1
    report = result.timeline.report()
    assert [f.kind for f in report.faults] == ["node-loss"]
    for fault in report.faults:
        assert fault.recovered_by == LAYER_JOB_CONTROLLER, fault
        assert fault.recovery_seconds is not None and fault.recovery_seconds > 0
        assert fault.steps_lost is not None
    assert report.final_step == settings.steps
    row = bench.summary_row(mode, result, report, plan)
    assert [f["recovered_by"] for f in row["faults"]] == [LAYER_JOB_CONTROLLER]
    assert 0 < row["goodput_from_submission"] < row["goodput_from_first_step"] <= 1
    assert row["startup_seconds"] > 0 and row["seconds_per_fault"] > 0
    table = bench.goodput_table([row], plan)
    assert "kubernetes-only (async)" in table
    print(table)  # the figures, for whoever runs it with -s
