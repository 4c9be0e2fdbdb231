"""Planned disruptions through the operator on the local cluster (rtj_operator.disruptions), with real
training (2 pods x 1 rank, the checkpoint volume).

One job goes through them and a fault in sequence: a cordon (nothing moves), `kubectl drain` (a
disruption: the pod, deleted with its grace period, is ended by its own kubelet after a checkpoint of
the step it was at, and the replacement resumes from that step without losing one), Karpenter's taint
and eviction, a spot interruption notice's taint (the operator moves the worker), the same notice as a
label the operator's settings name, then a node killed: the only fault. The same drain under the
Supervisor launcher, a drain held by the job's PodDisruptionBudget, and a drain whose replacement takes
the node a surge pod asked for while the old pod checkpointed (decide.surges), have a test each."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_cluster import (
    apply,
    event_reasons,
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
from rtj_localcluster.ports import reserve_port_pair
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator import constants, events, names
from rtj_operator.decide import conditions as cond
from rtj_operator.main import EmbeddedOperator
from rtj_operator.nodehealth import NodeHealth
from rtj_trainer.library import checkpoint, progress

pytestmark = pytest.mark.slow

STEPS = 60


def _drained_job(
    namespace: str, steps: int, step_sleep: str, checkpoint: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    """The job `drain`: rtj-train on two pods of one small rank each, `steps` steps `step_sleep` s
    apart, progress reported every second and 120 s of grace for the drain's checkpoint."""
    return job_manifest(
        "drain",
        namespace,
        nodes=2,
        command=["rtj-train"],
        args=["--steps", str(steps), "--step-sleep", step_sleep, "--hidden", "32", "--layers", "1"],
        processesPerNode=1,
        checkpoint=checkpoint,
        env=[{"name": "RTJ_PROGRESS_INTERVAL_SECONDS", "value": "1"}],
        terminationGracePeriodSeconds=120,
        **spec,
    )


def checkpoint_dir(kubeconfig: Path, namespace: str, job: str) -> Path:
    pvc = json.loads(kubectl(kubeconfig, "get", "pvc", f"{job}-checkpoints", "-n", namespace, "-o", "json"))
    pv = json.loads(kubectl(kubeconfig, "get", "pv", pvc["spec"]["volumeName"], "-o", "json"))
    return Path(pv["spec"]["hostPath"]["path"]) / job


# --- planned disruptions against faults (rtj_operator.disruptions), one job through several --------------


@contextlib.contextmanager
def watching_pod(kubeconfig: Path, namespace: str, name: str, out: Path) -> Iterator[None]:
    """`kubectl get -w` of one pod into `out`: its DELETED event carries the pod's last state."""
    watch = ["get", "pod", name, "-n", namespace, "-w", "--output-watch-events", "-o", "json"]
    with out.open("wb") as sink:
        process = subprocess.Popen(
            [str(program("kubectl")), f"--kubeconfig={kubeconfig}", *watch],
            stdout=sink,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield
        finally:
            process.terminate()
            process.wait()


def watched_events(out: Path) -> list[dict[str, Any]]:
    """The watch's events: JSON objects one after another."""
    text, decoder, found, at = out.read_text(), json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        event, at = decoder.raw_decode(text, at)
        found.append(event)
    return found


def committed_steps(kubeconfig: Path, namespace: str) -> list[int]:
    directory = checkpoint_dir(kubeconfig, namespace, "drain")
    return sorted(c.step for c in checkpoint.list_checkpoints(directory) if c.committed)


def assert_ended_by_its_kubelet_after_its_checkpoint(out: Path, uid: str) -> None:
    """The watched pod's last state (the DELETED event of the incarnation `uid`): the container's
    termination message, which only its kubelet writes before the final delete, says the checkpoint
    at SIGTERM committed."""
    deleted = [e["object"] for e in watched_events(out) if e.get("type") == "DELETED"]
    last = next((p for p in deleted if p["metadata"]["uid"] == uid), None)
    assert last is not None, f"the pod {uid} was never seen deleted"
    terminated = last["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["message"].startswith("Drained:"), terminated


def wait_worker_moved(kubeconfig: Path, namespace: str, off: set[str]) -> str:
    return wait_for(
        lambda: (
            node
            if (node := running_pods_on(kubeconfig, namespace, "drain").get("drain-worker-1"))
            and node not in off
            else None
        ),
        timeout=300,
        interval=0.5,
        message=f"worker 1 running off {sorted(off)}",
    )


def wait_step(kubeconfig: Path, namespace: str, step: int) -> int:
    found: int = wait_for(
        lambda: (
            s
            if (s := (job_status(kubeconfig, namespace, "drain").get("progress") or {}).get("step", 0))
            >= step
            else None
        ),
        timeout=300,
        interval=0.5,
        message=f"training to pass step {step}",
    )
    return found


def evict(kubeconfig: Path, namespace: str, pod: str, tmp_path: Path) -> None:
    """What Karpenter, the termination handler and `kubectl drain` do: a POST to the Eviction API."""
    body = tmp_path / f"evict-{pod}.json"
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    }
    body.write_text(json.dumps(eviction))
    kubectl(
        kubeconfig, "create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", str(body)
    )


def worker_1_uid(kubeconfig: Path, namespace: str) -> str:
    uid: str = pods(kubeconfig, namespace, "drain")["drain-worker-1"]["metadata"]["uid"]
    return uid


def assert_no_fault(kubeconfig: Path, namespace: str, disruptions: int) -> dict[str, Any]:
    status = job_status(kubeconfig, namespace, "drain")
    budget = status.get("budget") or {}
    assert not status.get("nodeFaults") and not status.get("excludedNodes"), status
    assert (budget.get("failuresUsed", 0), budget.get("disruptions", 0)) == (0, disruptions), budget
    reasons = event_reasons(kubeconfig, namespace, "drain")
    assert events.NODE_LOST not in reasons and events.STRANDED_POD_DELETED not in reasons, reasons
    return status


PLANNED_STEPS = 250
# The surge test's steps, a second each: the drained pod's checkpoint waits for the step in progress.
SURGE_STEPS = 20
SPOT_NOTICE = "aws-node-termination-handler/spot-itn"
# A site's own spot handler that labels the node: the operator's settings name the label.
SPOT_NOTICE_LABEL = "example.com/spot-notice"
SITE_NOTICE = NodeHealth(notice_labels={SPOT_NOTICE_LABEL: ("true",)})


@pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=3.0)
def test_cordon_drain_karpenter_and_spot_notice_are_disruptions_and_a_node_loss_after_them_a_fault(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    # The only checkpoints before the end are the SIGTERMs', every one kept.
    checkpoints = {"intervalSteps": 10000, "keep": 5}
    manifest = _drained_job(
        namespace, PLANNED_STEPS, "0.2", checkpoints, failurePolicy={"nodeLossGraceSeconds": 2}
    )
    with EmbeddedOperator(str(kubeconfig), namespaces=[namespace], node_health=SITE_NOTICE):
        apply(kubeconfig, manifest, tmp_path)
        wait_step(kubeconfig, namespace, 8)
        placed = running_pods_on(kubeconfig, namespace, "drain")
        drained, worker_0_node = placed["drain-worker-1"], placed["drain-worker-0"]
        uid = worker_1_uid(kubeconfig, namespace)

        # 1. A cordon alone: nothing moves, no fault.
        kubectl(kubeconfig, "cordon", drained)
        time.sleep(3)
        assert worker_1_uid(kubeconfig, namespace) == uid
        assert running_pods_on(kubeconfig, namespace, "drain") == placed
        assert_no_fault(kubeconfig, namespace, disruptions=0)

        # 2. kubectl drain: the pod's own kubelet ends it after the checkpoint at SIGTERM.
        with watching_pod(kubeconfig, namespace, "drain-worker-1", tmp_path / "drain.json"):
            kubectl(
                kubeconfig,
                *("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force"),
                "--timeout=200s",
                timeout=240,
            )
            tainted = wait_worker_moved(kubeconfig, namespace, {drained, worker_0_node})
        assert_ended_by_its_kubelet_after_its_checkpoint(tmp_path / "drain.json", uid)
        assert_no_fault(kubeconfig, namespace, disruptions=1)
        kubectl(kubeconfig, "uncordon", drained)
        wait_step(kubeconfig, namespace, committed_steps(kubeconfig, namespace)[-1] + 5)

        # 3. Karpenter's disruption taint moves nothing by itself; its eviction is a disruption.
        kubectl(kubeconfig, "taint", "node", tainted, "karpenter.sh/disrupted:NoSchedule")
        time.sleep(2)
        uid = worker_1_uid(kubeconfig, namespace)
        assert running_pods_on(kubeconfig, namespace, "drain").get("drain-worker-1") == tainted
        assert_no_fault(kubeconfig, namespace, disruptions=1)
        evict(kubeconfig, namespace, "drain-worker-1", tmp_path)
        noticed = wait_worker_moved(kubeconfig, namespace, {tainted, worker_0_node})
        assert noticed == drained  # the only node left: uncordoned
        assert_no_fault(kubeconfig, namespace, disruptions=2)
        kubectl(kubeconfig, "taint", "node", tainted, "karpenter.sh/disrupted:NoSchedule-")
        wait_step(kubeconfig, namespace, committed_steps(kubeconfig, namespace)[-1] + 5)

        # 4. A spot interruption notice: the operator moves the worker at once, checkpoint first.
        uid = worker_1_uid(kubeconfig, namespace)
        with watching_pod(kubeconfig, namespace, "drain-worker-1", tmp_path / "spot.json"):
            kubectl(
                kubeconfig, "taint", "node", noticed, "aws-node-termination-handler/spot-itn=1:NoSchedule"
            )
            lost = wait_worker_moved(kubeconfig, namespace, {noticed, worker_0_node})
        assert_ended_by_its_kubelet_after_its_checkpoint(tmp_path / "spot.json", uid)
        assert events.WORKER_MOVED in event_reasons(kubeconfig, namespace, "drain")
        assert_no_fault(kubeconfig, namespace, disruptions=3)
        kubectl(kubeconfig, "taint", "node", noticed, f"{SPOT_NOTICE}-")
        wait_step(kubeconfig, namespace, committed_steps(kubeconfig, namespace)[-1] + 5)

        # 4b. The same notice as a label the operator's settings name (a site's own spot handler).
        uid, labelled = worker_1_uid(kubeconfig, namespace), lost
        with watching_pod(kubeconfig, namespace, "drain-worker-1", tmp_path / "label.json"):
            kubectl(kubeconfig, "label", "node", labelled, f"{SPOT_NOTICE_LABEL}=true")
            lost = wait_worker_moved(kubeconfig, namespace, {labelled, worker_0_node})
        assert_ended_by_its_kubelet_after_its_checkpoint(tmp_path / "label.json", uid)
        assert_no_fault(kubeconfig, namespace, disruptions=4)
        kubectl(kubeconfig, "label", "node", labelled, f"{SPOT_NOTICE_LABEL}-")
        wait_step(kubeconfig, namespace, committed_steps(kubeconfig, namespace)[-1] + 5)

        # 5. A real node loss right after: a fault.
        local_cluster.kill_node(lost)
        wait_worker_moved(kubeconfig, namespace, {lost})
        done = wait_state(kubeconfig, namespace, "drain", "Succeeded", timeout=600)
    budget = done["budget"]
    assert (budget["failuresUsed"], budget["disruptions"]) == (1, 4), budget
    assert [f["nodeName"] for f in done["nodeFaults"]] == [lost], done["nodeFaults"]
    directory = checkpoint_dir(kubeconfig, namespace, "drain")
    committed = sorted(c.step for c in checkpoint.list_checkpoints(directory) if c.committed)
    assert len(committed) == 5 and committed[-1] == PLANNED_STEPS, committed  # four SIGTERMs' and the end
    for node in (0, 1):
        state = json.loads(progress.node_state_path(directory, node).read_text())
        # The first recovery from each SIGTERM's checkpoint (the node loss later resumes from the last).
        planned = [next(e for e in state["events"] if e.get("step") == step) for step in committed[:4]]
        assert [(e["resumedFrom"], e["stepsLost"]) for e in planned] == [("checkpoint", 0)] * 4, state


def drain_waiting(kubeconfig: Path, namespace: str, job: str) -> dict[str, Any] | None:
    conditions = job_status(kubeconfig, namespace, job).get("conditions") or []
    found: dict[str, Any] | None = next((c for c in conditions if c["type"] == cond.COND_DRAIN_WAITING), None)
    return found


@pytest.mark.local_cluster(nodes=2, profile="cpu")
def test_a_drain_held_by_the_jobs_disruption_budget_waits_and_the_job_says_so(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    budget = {"podDisruptionBudget": {"maxUnavailable": 0}}
    with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
        apply(kubeconfig, job_manifest("held", namespace, nodes=2, disruption=budget), tmp_path)
        wait_state(kubeconfig, namespace, "held", "Running", timeout=120)
        # The budget syncs (it could not as a maxUnavailable one over the job's pods) and allows nothing.
        wait_for(lambda: budget_synced(kubeconfig, namespace), timeout=60, message="the budget to sync")
        node = running_pods_on(kubeconfig, namespace, "held")["held-worker-1"]
        uid = pods(kubeconfig, namespace, "held")["held-worker-1"]["metadata"]["uid"]
        drain = (*("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force"), "--timeout=4s")
        kubectl(kubeconfig, *drain, check=False)  # gives up: the budget refuses the eviction
        waiting = wait_for(
            lambda: (
                c if (c := drain_waiting(kubeconfig, namespace, "held")) and c["status"] == "True" else None
            ),
            timeout=30,
            message="DrainWaiting=True",
        )
        assert waiting["reason"] == cond.REASON_POD_DISRUPTION_BUDGET
        assert f"worker 1 on {node} (Cordoned)" in waiting["message"], waiting
        pod = pods(kubeconfig, namespace, "held")["held-worker-1"]
        assert pod["metadata"]["uid"] == uid and not pod["metadata"].get("deletionTimestamp")
        assert cond.COND_DRAIN_WAITING in event_reasons(kubeconfig, namespace, "held")
        kubectl(kubeconfig, "uncordon", node)
        wait_for(
            lambda: (drain_waiting(kubeconfig, namespace, "held") or {}).get("status") == "False",
            timeout=30,
            message="DrainWaiting=False once the node is uncordoned",
        )


def budget_synced(kubeconfig: Path, namespace: str) -> bool:
    """The job's PodDisruptionBudget counts both workers healthy and allows no eviction."""
    name = names.disruption_budget_name("held")
    pdb = json.loads(kubectl(kubeconfig, "get", "pdb", name, "-n", namespace, "-o", "json"))
    status = pdb.get("status") or {}
    return (status.get("currentHealthy"), status.get("disruptionsAllowed")) == (2, 0)


@pytest.mark.local_cluster(nodes=5, profile="cpu", node_monitor_grace_seconds=3.0)
def test_a_drain_under_the_supervisor_launcher_is_a_disruption_and_no_fault(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Under Supervisor the drained pod's peers leave the world (PEER_DRAINED_EXIT_CODE): a gang
    restart from the drain's checkpoint, counted as disruptions, no failure budget spent."""
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    manifest = _drained_job(
        namespace,
        STEPS,
        "0.3",
        {"intervalSteps": 1000},
        hotSpares=1,
        rendezvous={"port": reserve_port_pair()},
        faultTolerance={"launcher": "Supervisor"},
    )
    with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
        apply(kubeconfig, manifest, tmp_path)
        wait_step(kubeconfig, namespace, 8)
        drained = running_pods_on(kubeconfig, namespace, "drain")["drain-worker-1"]
        uid = worker_1_uid(kubeconfig, namespace)
        with watching_pod(kubeconfig, namespace, "drain-worker-1", tmp_path / "drain.json"):
            kubectl(
                kubeconfig,
                *("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force"),
                "--timeout=200s",
                timeout=240,
            )
        assert_ended_by_its_kubelet_after_its_checkpoint(tmp_path / "drain.json", uid)
        done = wait_state(kubeconfig, namespace, "drain", "Succeeded", timeout=600)
        reasons = event_reasons(kubeconfig, namespace, "drain")
    assert (done["budget"].get("failuresUsed", 0), done["budget"]["disruptions"]) == (0, 2), done["budget"]
    assert not done.get("nodeFaults") and events.WORKER_FAILED not in reasons, reasons
    assert events.STRANDED_POD_DELETED not in reasons and events.NODE_LOST not in reasons, reasons
    directory = checkpoint_dir(kubeconfig, namespace, "drain")
    committed = sorted(c.step for c in checkpoint.list_checkpoints(directory) if c.committed)
    assert len(committed) == 2 and committed[-1] == STEPS, committed  # the drain's and the end


# --- a surge pod asks for the replacement's node while the drained pod checkpoints (decide.surges) ------


@dataclasses.dataclass(frozen=True)
class Seen:
    """A watch event of one of the job's pods, and when it arrived here (Unix time)."""

    at: float
    type: str
    pod: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def ready(self) -> bool:
        conditions = self.pod.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@contextlib.contextmanager
def pod_timeline(kubeconfig: Path, namespace: str, job: str) -> Iterator[list[Seen]]:
    """Every watch event of the job's pods (`kubectl get pods -w`), stamped when it arrives."""
    selector = f"{constants.LABEL_JOB}={job}"
    watch = ["get", "pods", "-n", namespace, "-l", selector, "-w", "--output-watch-events", "-o", "json"]
    seen: list[Seen] = []
    process = subprocess.Popen(
        [str(program("kubectl")), f"--kubeconfig={kubeconfig}", *watch],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )

    def read() -> None:
        pending = ""  # kubectl writes an event per line; a pretty-printed one spans several
        assert process.stdout is not None
        for line in process.stdout:
            pending += line
            try:
                event = json.loads(pending)
            except json.JSONDecodeError:
                continue
            pending = ""
            seen.append(Seen(time.time(), event["type"], event["object"]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        process.terminate()
        process.wait()
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def drain_moments(seen: list[Seen], old_uid: str) -> dict[str, float | None]:
    """When each step of worker 1's drain was seen, in seconds after its old pod was seen terminating."""

    def first(matches: Callable[[Seen], bool]) -> float | None:
        return next((s.at for s in seen if matches(s)), None)

    surge, worker = "drain-surge-1", "drain-worker-1"
    moments = {
        "old pod terminating": first(
            lambda s: s.uid == old_uid and bool(s.pod["metadata"].get("deletionTimestamp"))
        ),
        "surge pod created": first(lambda s: s.name == surge),
        "surge pod running": first(lambda s: s.name == surge and s.ready),
        "old pod gone": first(lambda s: s.uid == old_uid and s.type == "DELETED"),
        "replacement created": first(lambda s: s.name == worker and s.uid != old_uid),
        "surge pod gone": first(lambda s: s.name == surge and s.type == "DELETED"),
        "replacement running": first(lambda s: s.name == worker and s.uid != old_uid and s.ready),
    }
    start = moments["old pod terminating"]
    assert start is not None, "the drained pod was never seen terminating"
    return {step: None if at is None else round(at - start, 2) for step, at in moments.items()}


@pytest.mark.local_cluster(nodes=4, profile="cpu", node_monitor_grace_seconds=3.0)
def test_a_drained_workers_replacement_takes_the_node_its_surge_pod_held_while_the_old_pod_checkpointed(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The default launcher without spares: `kubectl drain` of worker 1's node. The surge pod exists
    while the old pod is still terminating, the replacement runs on the surge pod's node, the surge pod
    is gone afterwards; a disruption, no fault, no step lost."""
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    manifest = _drained_job(namespace, SURGE_STEPS, "1.0", {"intervalSteps": 1000})
    with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
        apply(kubeconfig, manifest, tmp_path)
        wait_step(kubeconfig, namespace, 4)
        placed = running_pods_on(kubeconfig, namespace, "drain")
        drained, worker_0_node = placed["drain-worker-1"], placed["drain-worker-0"]
        uid = worker_1_uid(kubeconfig, namespace)
        with (
            pod_timeline(kubeconfig, namespace, "drain") as seen,
            watching_pod(kubeconfig, namespace, "drain-worker-1", tmp_path / "drain.json"),
        ):
            kubectl(
                kubeconfig,
                *("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force"),
                "--timeout=200s",
                timeout=240,
            )
            moved = wait_worker_moved(kubeconfig, namespace, {drained, worker_0_node})
            wait_for(lambda: "drain-surge-1" not in pods(kubeconfig, namespace, "drain"), timeout=60)
        moments = drain_moments(seen, uid)
        surge_nodes = {s.pod["spec"].get("nodeName") for s in seen if s.name == "drain-surge-1"} - {None}
        print(f"drain of {drained}: " + ", ".join(f"{step} {at} s" for step, at in moments.items()))
        assert_ended_by_its_kubelet_after_its_checkpoint(tmp_path / "drain.json", uid)
        done = wait_state(kubeconfig, namespace, "drain", "Succeeded", timeout=600)
        reasons = event_reasons(kubeconfig, namespace, "drain")
        left = pods(kubeconfig, namespace, "drain")
    created, running, gone = (
        moments["surge pod created"],
        moments["surge pod running"],
        moments["old pod gone"],
    )
    assert created is not None and gone is not None and created < gone, moments  # beside the old pod
    assert running is not None and running < gone, moments
    assert surge_nodes == {moved}, (surge_nodes, moved)  # the replacement runs where the surge pod was
    assert events.SURGE_CREATED in reasons and events.SURGE_USED in reasons, reasons
    assert moments["surge pod gone"] is not None and "drain-surge-1" not in left, (moments, left)
    assert (done["budget"].get("failuresUsed", 0), done["budget"]["disruptions"]) == (0, 1), done["budget"]
    assert not done.get("nodeFaults") and not done.get("excludedNodes"), done
    assert events.NODE_LOST not in reasons and events.STRANDED_POD_DELETED not in reasons, reasons
    directory = checkpoint_dir(kubeconfig, namespace, "drain")
    committed = sorted(c.step for c in checkpoint.list_checkpoints(directory) if c.committed)
    assert len(committed) == 2 and committed[-1] == SURGE_STEPS, committed  # the drain's and the end
    for node in (0, 1):
        state = json.loads(progress.node_state_path(directory, node).read_text())
        resumed = next(e for e in state["events"] if e.get("step") == committed[0])
        assert (resumed["resumedFrom"], resumed["stepsLost"]) == ("checkpoint", 0), state
