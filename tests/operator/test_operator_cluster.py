"""The operator in-process against a Kubernetes API: lifecycle, progress read from the pods' endpoints,
the trainer's lack of any pod write access, node loss, budgets, suspend, restarts, invalid objects.
Fault tests use the embedded local cluster's fault injection."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from operator_cluster import (
    apply,
    event_reasons,
    get,
    install_crd,
    job_manifest,
    job_status,
    new_namespace,
    pods,
    running_pods_on,
    wait_state,
)
from rtj_localcluster.binaries import program
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import create_namespace, kubectl, wait_for
from rtj_operator import constants, events
from rtj_operator.decide import conditions as cond
from rtj_operator.main import EmbeddedOperator
from rtj_operator.runtime import job_pass, kube
from rtj_operator.runtime.queue import JobRunner

pytestmark = pytest.mark.slow
CPU_CLUSTER = pytest.mark.local_cluster(nodes=4, profile="cpu", node_monitor_grace_seconds=3.0)


# A trainer stand-in: it writes one progress report where rtj-launch serves it, then idles.
REPORT = {
    "v": 1,
    "time": "2026-01-01T12:01:40Z",
    "step": 42,
    "lastCheckpoint": {"step": 40, "time": "2026-01-01T12:01:30Z"},
    "restarts": {"inProcess": 1, "inJob": 2},
    "usefulStepSeconds": 50.0,
    "trainStartTime": "2026-01-01T12:00:00Z",
}
REPORT_AND_SLEEP = [
    "python",
    "-c",
    "import os, time; open(os.environ['RTJ_PROGRESS_FILE'], 'w').write(os.environ['TEST_REPORT']); "
    "time.sleep(600)",
]


def kubeconfig_with_token(kubeconfig: Path, namespace: str, account: str, tmp_path: Path) -> Path:
    """A kubeconfig that authenticates as `account` only, with a token from the TokenRequest API."""
    token = kubectl(kubeconfig, "create", "token", account, "-n", namespace, "--duration=10m").strip()
    config = yaml.safe_load(kubectl(kubeconfig, "config", "view", "--raw", "--minify", "--flatten"))
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path = tmp_path / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def assert_cannot_write_pods(kubeconfig: Path, namespace: str, account: str, tmp_path: Path) -> None:
    """RBAC as the API server applies it: the account may not change any pod, and a real patch of
    a worker's image with the account's own token is refused with 403 Forbidden."""
    subject = f"--as=system:serviceaccount:{namespace}:{account}"
    for verb in ("patch", "update", "create", "delete"):
        answer = kubectl(kubeconfig, "auth", "can-i", verb, "pods", "-n", namespace, subject, check=False)
        assert answer.strip() == "no", (verb, answer)
    as_trainer = kubeconfig_with_token(kubeconfig, namespace, account, tmp_path)
    patch = json.dumps({"spec": {"containers": [{"name": "trainer", "image": "attacker/evil:1"}]}})
    argv = ["-n", namespace, "patch", "pod", "life-worker-1", "--type=strategic", "-p", patch]
    result = subprocess.run(
        [str(program("kubectl")), f"--kubeconfig={as_trainer}", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0 and "(Forbidden)" in result.stderr, result.stderr
    assert f"system:serviceaccount:{namespace}:{account}" in result.stderr, result.stderr


@pytest.fixture
def cluster(local_cluster: LocalCluster) -> LocalCluster:
    install_crd(local_cluster.kubeconfig_path)
    return local_cluster


def pod_quota(kubeconfig: Path, namespace: str, pods: int) -> None:
    """A ResourceQuota of `pods` pods in `namespace`, once the API server enforces it."""
    kubectl(kubeconfig, "-n", namespace, "create", "quota", "pods", f"--hard=pods={pods}")
    wait_for(
        lambda: get(kubeconfig, "-n", namespace, "resourcequota", "pods").get("status", {}).get("hard"),
        timeout=60,
        message="the quota's status",
    )


def test_lifecycle_children_status_columns_and_deletion(kubeconfig: Path, tmp_path: Path) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            nodes = get(kubeconfig, "nodes")["items"]
            instance_type = nodes[0]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE]
            job = job_manifest(
                "life",
                namespace,
                nodes=2,
                instanceType=instance_type,
                command=REPORT_AND_SLEEP,
                env=[
                    {"name": "RTJ_LAUNCH_MODE", "value": "direct"},
                    {"name": "TEST_REPORT", "value": json.dumps(REPORT)},
                ],
            )
            apply(kubeconfig, job, tmp_path)
            status = wait_state(kubeconfig, namespace, "life", "Running")
            assert status["workers"]["readyText"] == "2/2" and status["observedGeneration"] == 1
            ready = next(c for c in status["conditions"] if c["type"] == "Ready")
            assert (ready["status"], ready["reason"]) == ("True", cond.REASON_ALL_WORKERS_READY)
            service = get(kubeconfig, "-n", namespace, "service", "life")
            assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
            for kind, name in [("pvc", "life-checkpoints"), ("serviceaccount", "life-trainer")]:
                assert get(kubeconfig, "-n", namespace, kind, name)["metadata"]["name"] == name
            assert_cannot_write_pods(kubeconfig, namespace, "life-trainer", tmp_path)
            worker = pods(kubeconfig, namespace, "life")["life-worker-1"]
            container = worker["spec"]["containers"][0]
            assert container["command"] == ["rtj-launch"] and container["args"][0] == "--"
            assert worker["metadata"]["labels"][constants.LABEL_WORKER_INDEX] == "1"
            columns = kubectl(kubeconfig, "-n", namespace, "get", "rtj", "life").splitlines()
            header, row = columns[0].split(), columns[1].split()
            assert header[:4] == ["NAME", "STATE", "NODES", "RESTARTS"]
            # RESTARTS is 0 until the report's restarts (1 + 2) are folded, one endpoint read after
            # the pods run: that read may come before this line on a warm cluster.
            assert row[:3] == ["life", "Running", "2/2"] and row[3] in ("0", "3")
            assert events.CHILDREN_CREATED in event_reasons(kubeconfig, namespace, "life")

            # The pods' progress reports, read from their endpoints, reach status.
            progressed = wait_for(
                lambda: s if (s := job_status(kubeconfig, namespace, "life")).get("progress") else None,
                timeout=60,
                message="progress in status",
            )
            assert progressed["progress"]["step"] == 42 and progressed["progress"]["goodputPercent"] == 50.0
            assert progressed["lastCheckpoint"]["step"] == 40
            assert progressed["restarts"] == {"inProcess": 1, "inJob": 2, "podReplacement": 0, "total": 3}

            kubectl(kubeconfig, "-n", namespace, "delete", "rtj", "life", "--wait=true", "--timeout=60s")
            wait_for(lambda: not pods(kubeconfig, namespace, "life"), timeout=60, message="pods to go")
            wait_for(
                lambda: not get(kubeconfig, "-n", namespace, "service", "life"),
                timeout=60,
                message="svc gone",
            )
            # retentionPolicy Retain (the default): the checkpoint volume outlives the job.
            assert get(kubeconfig, "-n", namespace, "pvc", "life-checkpoints")["metadata"]["name"]
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


@CPU_CLUSTER
def test_node_kill_replaces_worker_on_the_hot_spares_node(cluster: LocalCluster, tmp_path: Path) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = job_manifest(
            "spare",
            "default",
            nodes=2,
            hotSpares=1,
            failurePolicy={"repeatOffenderThreshold": 1, "taintExcludedNodes": True},
        )
        apply(kc, job, tmp_path)
        wait_state(kc, "default", "spare", "Running")
        placed = wait_for(lambda: p if len(p := running_pods_on(kc, "default", "spare")) == 3 else None)
        victim, spare_node = placed["spare-worker-1"], placed["spare-spare-0"]
        cluster.kill_node(victim)
        moved = wait_for(
            lambda: running_pods_on(kc, "default", "spare").get("spare-worker-1") == spare_node,
            timeout=90,
            message="worker 1 to run on the spare's node",
        )
        assert moved
        # The old pod, deleted on a dead node, would stay Terminating for good: the operator removed
        # it (its name is the replacement's now), and nothing of the job is left on the dead node.
        assert not [n for n, p in pods(kc, "default", "spare").items() if p["spec"].get("nodeName") == victim]
        status = wait_state(kc, "default", "spare", "Running", timeout=90)
        assert status["restarts"]["podReplacement"] == 1 and status["restarts"]["total"] >= 1
        assert [e["nodeName"] for e in status["excludedNodes"]] == [victim]
        assert status["nodeFaults"][0]["nodeName"] == victim
        wait_for(lambda: status_spares(kc) == 1, timeout=60, message="the spare to be replenished")
        reasons = event_reasons(kc, "default", "spare")
        for reason in (
            events.NODE_LOST,
            events.SPARE_USED,
            events.WORKER_REPLACED,
            events.NODE_EXCLUDED,
            events.NODE_TAINTED,
        ):
            assert reason in reasons
        assert events.GANG_RESTART not in reasons  # worker 1 is not the rendezvous host
        taint = {"key": constants.TAINT_EXCLUDED, "value": "spare", "effect": "NoSchedule"}
        assert taint in get(kc, "node", victim)["spec"]["taints"]
        # Deleting the job takes its cluster-wide taint away again.
        kubectl(kc, "-n", "default", "delete", "rtj", "spare", "--wait=true", "--timeout=60s")
        wait_for(
            lambda: taint not in (get(kc, "node", victim)["spec"].get("taints") or []),
            timeout=60,
            message="the exclusion taint to be removed",
        )


def status_spares(kc: Path) -> int:
    return int(job_status(kc, "default", "spare").get("workers", {}).get("readySpares", 0))


@CPU_CLUSTER
def test_deleted_node_of_worker_zero_is_excluded_and_the_gang_restarted(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        apply(kc, job_manifest("gang", "default", nodes=2), tmp_path)
        wait_state(kc, "default", "gang", "Running")
        before = pods(kc, "default", "gang")
        lost = before["gang-worker-0"]["spec"]["nodeName"]
        cluster.delete_node(lost)
        wait_for(
            lambda: job_status(kc, "default", "gang").get("restarts", {}).get("podReplacement") == 1,
            timeout=60,
            message="the loss to be counted",
        )
        status = wait_state(kc, "default", "gang", "Running", timeout=90)
        after = pods(kc, "default", "gang")
        assert set(after) == {"gang-worker-0", "gang-worker-1"}
        # Both pods are new (a gang restart), and none runs on the deleted node.
        assert {p["metadata"]["uid"] for p in after.values()}.isdisjoint(
            p["metadata"]["uid"] for p in before.values()
        )
        assert lost not in {p["spec"]["nodeName"] for p in after.values()}
        assert status["excludedNodes"][0] == {
            **status["excludedNodes"][0],
            "nodeName": lost,
            "reason": "NodeDeleted",
        }
        assert events.GANG_RESTART in event_reasons(kc, "default", "gang")


@CPU_CLUSTER
def test_deleted_node_of_worker_zero_is_one_replacement_with_the_rendezvous_in_the_store_pod(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        rendezvous = {"host": "StorePod", "port": reserve_port()}
        apply(kc, job_manifest("hosted", "default", nodes=2, rendezvous=rendezvous), tmp_path)
        wait_state(kc, "default", "hosted", "Running")
        before = pods(kc, "default", "hosted")
        assert set(before) == {"hosted-store", "hosted-worker-0", "hosted-worker-1"}
        # The store pod's command is the rendezvous host's, and it never shares a worker's node.
        store_spec = before["hosted-store"]["spec"]
        assert "--rendezvous-id" in store_spec["containers"][0]["command"]
        lost = before["hosted-worker-0"]["spec"]["nodeName"]
        worker_nodes = {p["spec"]["nodeName"] for n, p in before.items() if "worker" in n}
        assert store_spec["nodeName"] not in worker_nodes
        cluster.delete_node(lost)
        wait_for(
            lambda: job_status(kc, "default", "hosted").get("restarts", {}).get("podReplacement") == 1,
            timeout=60,
            message="the loss to be counted",
        )
        wait_for(
            lambda: (
                (p := pods(kc, "default", "hosted").get("hosted-worker-0")) is not None
                and p["metadata"]["uid"] != before["hosted-worker-0"]["metadata"]["uid"]
            ),
            timeout=60,
            message="worker 0's replacement",
        )
        status = wait_state(kc, "default", "hosted", "Running", timeout=90)
        after = pods(kc, "default", "hosted")
        # Only worker 0's pod is new: worker 1 and the store pod (the rendezvous) went on.
        for name in ("hosted-store", "hosted-worker-1"):
            assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"], name
        assert lost not in {p["spec"]["nodeName"] for p in after.values()}
        assert status["restarts"]["podReplacement"] == 1 and status["store"]["state"] == "Running"
        reasons = event_reasons(kc, "default", "hosted")
        assert events.GANG_RESTART not in reasons and events.WORKER_REPLACED in reasons


@CPU_CLUSTER
def test_budget_exhaustion_fails_the_job_and_keeps_its_data(cluster: LocalCluster, tmp_path: Path) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        failing = ["python", "-c", "import sys, time; time.sleep(2); sys.exit(3)"]
        apply(
            kc,
            job_manifest(
                "budget", "default", nodes=2, command=failing, failurePolicy={"maxNodeReplacements": 1}
            ),
            tmp_path,
        )
        status = wait_state(kc, "default", "budget", "Failed", timeout=120)
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == events.RESTART_BUDGET_EXHAUSTED and "1 of 1" in failed["message"]
        assert status["restarts"]["podReplacement"] == 1  # one gang restart was allowed, then no more
        wait_for(lambda: not running_pods_on(kc, "default", "budget"), timeout=60, message="workers deleted")
        assert (
            get(kc, "-n", "default", "pvc", "budget-checkpoints")["metadata"]["name"] == "budget-checkpoints"
        )
        reasons = event_reasons(kc, "default", "budget")
        assert events.WORKER_FAILED in reasons and events.RESTART_BUDGET_EXHAUSTED in reasons


@CPU_CLUSTER
def test_suspend_removes_workers_and_resume_brings_them_back(cluster: LocalCluster, tmp_path: Path) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        apply(kc, job_manifest("pause", "default", nodes=2, hotSpares=1), tmp_path)
        wait_state(kc, "default", "pause", "Running")
        kubectl(
            kc, "-n", "default", "patch", "rtj", "pause", "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        wait_state(kc, "default", "pause", "Suspended")
        wait_for(lambda: not pods(kc, "default", "pause"), timeout=60, message="pods to be deleted")
        assert get(kc, "-n", "default", "service", "pause")["metadata"]["name"] == "pause"  # kept
        kubectl(
            kc, "-n", "default", "patch", "rtj", "pause", "--type=merge", "-p", '{"spec":{"suspend":false}}'
        )
        status = wait_state(kc, "default", "pause", "Running", timeout=90)
        assert status["restarts"]["podReplacement"] == 0
        assert len(running_pods_on(kc, "default", "pause")) == 3
        reasons = event_reasons(kc, "default", "pause")
        assert events.SUSPENDED in reasons and events.RESUMED in reasons


@CPU_CLUSTER
def test_operator_restarted_during_a_recovery_converges_without_duplicates(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        apply(kc, job_manifest("again", "default", nodes=3), tmp_path)
        wait_state(kc, "default", "again", "Running")
    # The operator is down while a node dies; it starts, counts the loss, and is stopped again in the
    # middle of the recovery (after the decision, before the replacement is running).
    victim = pods(kc, "default", "again")["again-worker-2"]["spec"]["nodeName"]
    cluster.kill_node(victim)
    wait_for(lambda: cluster.node_ready_status(victim) == "Unknown", timeout=60, message="node Unknown")
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        wait_for(
            lambda: job_status(kc, "default", "again").get("restarts", {}).get("podReplacement") == 1,
            timeout=60,
            message="the loss to be counted",
        )
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        status = wait_state(kc, "default", "again", "Running", timeout=90)
        wait_for(lambda: len(running_pods_on(kc, "default", "again")) == 3, timeout=60, message="3 workers")
    names = sorted(pods(kc, "default", "again"))
    assert names == ["again-worker-0", "again-worker-1", "again-worker-2"]
    assert status["restarts"]["podReplacement"] == 1  # counted once across three operator lives
    assert victim not in running_pods_on(kc, "default", "again").values()


@CPU_CLUSTER
def test_invalid_object_gets_a_condition_and_others_are_still_served(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    # Serve the API with a schema that accepts anything, as a cluster whose CRD lost its validation
    # would: the operator is the last line of defence.
    crd = yaml.safe_load(next((Path(__file__).resolve().parents[2] / "crds").glob("*.yaml")).read_text())
    for version in crd["spec"]["versions"]:
        version["schema"] = {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        }
    (tmp_path / "loose-crd.yaml").write_text(yaml.safe_dump(crd))
    kubectl(kc, "apply", "-f", str(tmp_path / "loose-crd.yaml"))
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        bad = job_manifest("broken", "default", nodes=0)
        del bad["spec"]["image"]
        apply(kc, bad, tmp_path)
        apply(kc, job_manifest("fine", "default", nodes=1), tmp_path)
        wait_state(kc, "default", "fine", "Running")

        def invalid_status() -> dict[str, Any] | None:
            found = job_status(kc, "default", "broken")
            reasons = [c.get("reason") for c in found.get("conditions", [])]
            return found if events.INVALID_SPEC in reasons else None

        status = wait_for(invalid_status, timeout=60, message="the InvalidSpec condition")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (
            ready["status"] == "False"
            and "spec.nodes" in ready["message"]
            and "spec.image" in ready["message"]
        )
        assert events.INVALID_SPEC in event_reasons(kc, "default", "broken")
        assert not pods(kc, "default", "broken")


@CPU_CLUSTER
def test_success_then_ttl_deletes_the_job_and_delete_policy_its_volume(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        done = ["python", "-c", "import time; time.sleep(1)"]
        manifest = job_manifest(
            "done", "default", nodes=2, hotSpares=1, command=done, ttlSecondsAfterFinished=3
        )
        manifest["spec"]["checkpoint"]["retentionPolicy"] = "Delete"
        apply(kc, manifest, tmp_path)
        status = wait_state(kc, "default", "done", "Succeeded", timeout=120)
        assert status["completionTime"] and status["workers"]["pods"][0]["state"] == "Succeeded"
        wait_for(lambda: not get(kc, "-n", "default", "rtj", "done"), timeout=90, message="the job to expire")
        wait_for(
            lambda: not get(kc, "-n", "default", "pvc", "done-checkpoints"), timeout=60, message="pvc gone"
        )
        wait_for(lambda: not pods(kc, "default", "done"), timeout=60, message="pods gone")


def _instance_type(kubeconfig: Path) -> str:
    return str(get(kubeconfig, "nodes")["items"][0]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE])


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def _blocked(kubeconfig: Path, namespace: str, job: str) -> dict[str, Any] | None:
    """The job's Blocked condition while it is True."""
    found = _condition(job_status(kubeconfig, namespace, job), cond.COND_BLOCKED)
    return found if found and found["status"] == "True" else None


def test_a_child_refused_by_a_resource_quota_is_a_condition_and_is_not_retried(
    kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    creates: list[str] = []
    create = kube.Kube.create

    def counting_create(self: kube.Kube, manifest: Mapping[str, Any]) -> bool:
        if manifest.get("kind") == "Pod":
            creates.append(str(manifest["metadata"]["name"]))
        return create(self, manifest)

    monkeypatch.setattr(kube.Kube, "create", counting_create)
    try:
        pod_quota(kubeconfig, namespace, 1)
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            manifest = job_manifest("quota", namespace, nodes=2, instanceType=_instance_type(kubeconfig))
            apply(kubeconfig, manifest, tmp_path)

            condition = wait_for(lambda: _blocked(kubeconfig, namespace, "quota"), timeout=60, interval=0.2,
                                 message="the Blocked condition")  # fmt: skip
            # Within one reconcile: one create per worker, the refused one included, then the condition.
            assert creates == ["quota-worker-0", "quota-worker-1"]
            assert condition["reason"] == events.QUOTA_EXCEEDED and condition["observedGeneration"] == 1
            # The API server's own message: which quota, what was asked, used and limited.
            assert "exceeded quota: pods" in condition["message"]
            assert "limited: pods=1" in condition["message"]
            wait_for(
                lambda: events.QUOTA_EXCEEDED in event_reasons(kubeconfig, namespace, "quota"),
                timeout=30,
                message="the QuotaExceeded Event",
            )
            # Worker 0 starts (pod events, passes), and still nothing is created again.
            wait_for(lambda: running_pods_on(kubeconfig, namespace, "quota"), timeout=60, message="worker 0")
            time.sleep(5)
            assert creates == ["quota-worker-0", "quota-worker-1"]
            assert event_reasons(kubeconfig, namespace, "quota").count(events.QUOTA_EXCEEDED) == 1
            assert job_status(kubeconfig, namespace, "quota")["state"] == "Blocked"
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


# A worker that takes its whole grace period to end, as one committing a checkpoint at SIGTERM does.
SLOW_TO_END = [
    "python",
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
]


def test_a_surge_pod_refused_by_a_resource_quota_blocks_nothing_and_is_not_asked_for_again(
    kubeconfig: Path, tmp_path: Path
) -> None:
    """A quota with room for the workers only: the surge pod of a deleted worker is refused (the
    terminating pod still counts), its entry leaves status with one SurgeRefused, the job is not
    Blocked, and the replacement is created once the old pod is gone."""
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    try:
        pod_quota(kubeconfig, namespace, 2)
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            manifest = job_manifest(
                "surge",
                namespace,
                nodes=2,
                command=SLOW_TO_END,
                instanceType=_instance_type(kubeconfig),
                terminationGracePeriodSeconds=6,
            )
            apply(kubeconfig, manifest, tmp_path)
            wait_state(kubeconfig, namespace, "surge", "Running", timeout=120)
            old = pods(kubeconfig, namespace, "surge")["surge-worker-1"]["metadata"]["uid"]
            kubectl(kubeconfig, "-n", namespace, "delete", "pod", "surge-worker-1", "--wait=false")
            wait_for(
                lambda: events.SURGE_REFUSED in event_reasons(kubeconfig, namespace, "surge"),
                timeout=60,
                message="the SurgeRefused Event",
            )
            assert _blocked(kubeconfig, namespace, "surge") is None
            wait_for(
                lambda: (
                    (p := pods(kubeconfig, namespace, "surge").get("surge-worker-1"))
                    and p["metadata"]["uid"] != old
                    and p.get("status", {}).get("phase") == "Running"
                ),
                timeout=120,
                message="worker 1's replacement running",
            )
            status = wait_state(kubeconfig, namespace, "surge", "Running", timeout=60)
            reasons = event_reasons(kubeconfig, namespace, "surge")
        assert [e["role"] for e in status["workers"]["pods"]] == ["worker", "worker"], status["workers"]
        assert reasons.count(events.SURGE_REFUSED) == 1 and events.QUOTA_EXCEEDED not in reasons, reasons
        blocked = _condition(status, cond.COND_BLOCKED)
        assert blocked is None or blocked["status"] != "True", blocked
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


def test_a_status_written_by_someone_else_is_corrected_on_the_next_event(
    kubeconfig: Path, tmp_path: Path
) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            manifest = job_manifest("forged", namespace, nodes=1, instanceType=_instance_type(kubeconfig))
            apply(kubeconfig, manifest, tmp_path)
            wait_state(kubeconfig, namespace, "forged", "Running")
            forged = {
                "status": {
                    "state": "Succeeded",
                    "conditions": [
                        {
                            "type": "Succeeded",
                            "status": "True",
                            "reason": "Forged",
                            "message": "written by hand",
                            "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }
                    ],
                }
            }
            kubectl(
                kubeconfig,
                "-n",
                namespace,
                "patch",
                "rtj",
                "forged",
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(forged),
            )
            started = time.monotonic()
            status = wait_state(kubeconfig, namespace, "forged", "Running", timeout=30)
            assert time.monotonic() - started < 10  # the next event, not the 60 s safety net
            assert (_condition(status, cond.COND_SUCCEEDED) or {}).get("status") != "True"
            assert events.STATUS_OVERWRITTEN in event_reasons(kubeconfig, namespace, "forged")
            assert len(running_pods_on(kubeconfig, namespace, "forged")) == 1  # nothing was torn down
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


RUNNING_STATUS = {
    "state": "Running",
    "restarts": {"inProcess": 0, "inJob": 0, "podReplacement": 0, "total": 0},
}
COUNTED_STATUS = {
    "state": "Recovering",
    "restarts": {"inProcess": 0, "inJob": 0, "podReplacement": 1, "total": 1},
}


def test_a_status_write_whose_answer_was_lost_is_still_the_operators_own(
    kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status write lands but its answer is lost (a read timeout), and sent again it meets a conflict:
    the stored status is still the operator's own. Taken for someone else's, it would be replaced by the
    one before the write, and the fault the write counted counted again. A status someone else wrote
    is still told apart."""
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    try:
        apply(kubeconfig, job_manifest("lost", namespace, nodes=1), tmp_path)
        client = kube.Kube.from_kubeconfig(str(kubeconfig))
        ctx, runner = job_pass.new_context(client), JobRunner()

        def write(status: dict[str, Any]) -> dict[str, Any] | None:
            body = client.get_job(namespace, "lost")
            assert body is not None
            return asyncio.run(job_pass.write_status(ctx, body, status, runner))

        assert write(RUNNING_STATUS) is not None
        send, lost = kube.Kube._send, list[str]()

        def answer_lost(self: kube.Kube, method: str, path: str, **options: Any) -> dict[str, Any]:
            answer = send(self, method, path, **options)
            if method == "PATCH" and not lost:
                lost.append(path)
                raise urllib3.exceptions.ReadTimeoutError(None, path, "read timed out")  # type: ignore[arg-type]
            return answer

        monkeypatch.setattr(kube.Kube, "_send", answer_lost)
        assert write(COUNTED_STATUS) is None and lost  # sent again: a conflict
        stored = client.get_job(namespace, "lost")
        assert stored is not None and stored["status"]["restarts"]["podReplacement"] == 1
        assert not job_pass.overwritten(runner, stored)
        assert runner.last_status == stored["status"]
        forged = {"status": {"state": "Succeeded"}}
        kubectl(kubeconfig, "-n", namespace, "patch", "rtj", "lost", "--subresource=status", "--type=merge",
                "-p", json.dumps(forged))  # fmt: skip
        assert job_pass.overwritten(runner, client.get_job(namespace, "lost") or {})
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


def test_a_job_larger_than_the_cluster_creates_no_pods_and_says_why(kubeconfig: Path, tmp_path: Path) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            manifest = job_manifest("huge", namespace, nodes=1000, instanceType=_instance_type(kubeconfig))
            apply(kubeconfig, manifest, tmp_path)

            condition = wait_for(lambda: _blocked(kubeconfig, namespace, "huge"), timeout=60,
                                 message="the Blocked condition")  # fmt: skip
            assert condition["reason"] == events.INSUFFICIENT_NODES
            assert condition["message"].startswith("1000 nodes needed for the workers")
            time.sleep(3)
            assert not pods(kubeconfig, namespace, "huge")
            assert event_reasons(kubeconfig, namespace, "huge").count(events.INSUFFICIENT_NODES) == 1
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


def test_a_pod_refused_by_pod_security_is_a_child_rejected_condition(
    kubeconfig: Path, tmp_path: Path
) -> None:
    install_crd(kubeconfig)
    # The job mounts a hostPath volume, which the restricted Pod Security level forbids.
    namespace = create_namespace(
        kubeconfig, "rtj-test", labels={"pod-security.kubernetes.io/enforce": "restricted"}
    )
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            manifest = job_manifest(
                "psa",
                namespace,
                nodes=1,
                instanceType=_instance_type(kubeconfig),
                volumes=[{"name": "host", "hostPath": {"path": "/var/log"}}],
                volumeMounts=[{"name": "host", "mountPath": "/host-log"}],
            )
            apply(kubeconfig, manifest, tmp_path)

            condition = wait_for(lambda: _blocked(kubeconfig, namespace, "psa"), timeout=60,
                                 message="the Blocked condition")  # fmt: skip
            assert condition["reason"] == events.CHILD_REJECTED
            assert "403 Forbidden" in condition["message"] and "violates PodSecurity" in condition["message"]
            wait_for(
                lambda: events.CHILD_REJECTED in event_reasons(kubeconfig, namespace, "psa"),
                timeout=30,
                message="the ChildRejected Event",
            )
            assert not pods(kubeconfig, namespace, "psa")
            assert events.CHILDREN_CREATED not in event_reasons(kubeconfig, namespace, "psa")
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
