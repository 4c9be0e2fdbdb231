"""Training that stops advancing, on the local cluster: the operator reads the step from the worker's
progress endpoint, reports the job Stalled (condition and Warning Event) while its pod stays Ready,
clears it when the step advances again, advises a checkpoint interval once a fault was counted, and
ends a recovery only when the replacement's training advances, not when its pod is ready.

The worker runs a stand-in for the trainer (direct launch mode, no torch): it writes progress reports
where rtj-launch serves them, takes five steps (a save blocking 2 s, one in-process restart), then
hangs at step 5 until the test drops a marker on the checkpoint volume. Its replacement waits
`FIRST_STEP_DELAY` seconds before its first step, as a restarted trainer loading a checkpoint does,
and goes on from the checkpoint of step 4.
A second test runs the real trainer (rtj-train under ft_launcher, torch on CPU) into an injected
hang that outlasts every timeout of its own recovery layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from operator_cluster import apply, event_reasons, install_crd, job_manifest, job_status, new_namespace
from rtj_contract.times import parse_rfc3339
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator import constants, events, status_cli
from rtj_operator.decide import conditions as cond
from rtj_operator.main import EmbeddedOperator

pytestmark = pytest.mark.slow

STALL_AFTER_SECONDS = 12  # above the operator's 5 s between reads of the endpoint
FIRST_STEP_DELAY = 8
STAND_IN = f"""
import json, os, pathlib, time
out = os.environ["RTJ_PROGRESS_FILE"]
directory = pathlib.Path(os.environ["RTJ_CHECKPOINT_DIR"])
first = not (directory / "started").exists()
(directory / "started").touch()
start = time.time()
def rfc(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + "Z"
def report(step):
    body = {{"v": 1, "time": rfc(time.time()), "step": step, "stepTimeSeconds": 0.5,
            "restarts": {{"inProcess": 1 if first and step >= 3 else 0, "inJob": 0}},
            "checkpointBlockingSeconds": 2.0 if step >= 2 else 0.0, "usefulStepSeconds": step * 0.5,
            "lastCheckpoint": {{"step": 4, "time": rfc(start)}} if step >= 4 else None,
            "trainStartTime": rfc(start)}}
    with open(out + ".tmp", "w") as f:
        f.write(json.dumps(body))
    os.replace(out + ".tmp", out)
step = 5  # a replacement resumes after the checkpoint of step 4
if first:
    for step in range(1, 6):
        report(step)
        time.sleep(0.5)
    while not (directory / "resume").exists():
        time.sleep(0.2)
    step = 6
else:
    time.sleep({FIRST_STEP_DELAY})
while True:
    report(step)
    step += 1
    time.sleep(0.5)
"""


def checkpoint_dir(kubeconfig: Path, namespace: str, job: str) -> Path:
    pvc = json.loads(kubectl(kubeconfig, "get", "pvc", f"{job}-checkpoints", "-n", namespace, "-o", "json"))
    pv = json.loads(kubectl(kubeconfig, "get", "pv", pvc["spec"]["volumeName"], "-o", "json"))
    return Path(pv["spec"]["hostPath"]["path"]) / job


def condition(status: dict[str, object], type_: str) -> dict[str, str]:
    conditions = status.get("conditions")
    assert isinstance(conditions, list)
    found: dict[str, str] = next(c for c in conditions if c["type"] == type_)
    return found


def test_a_job_whose_step_stops_is_stalled_then_resumes_and_recovers_only_when_training_advances(
    kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    nodes = json.loads(kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
    manifest = job_manifest(
        "stall",
        namespace,
        nodes=1,
        instanceType=nodes[0]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE],
        command=["python", "-c", STAND_IN],
        progress={"stallAfterSeconds": STALL_AFTER_SECONDS},
    )
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            apply(kubeconfig, manifest, tmp_path)

            def hung_at_step_5() -> dict[str, Any] | None:
                status = job_status(kubeconfig, namespace, "stall")
                step = (status.get("progress") or {}).get("currentStep")
                return status if status.get("state") == "Stalled" and step == 5 else None

            stalled = wait_for(hung_at_step_5, timeout=180, interval=1, message="the job to be Stalled")
            # The pod is Ready all along: only the step says training stopped.
            assert condition(stalled, "Ready")["status"] == "True"
            stall = condition(stalled, "Stalled")
            assert (stall["status"], stall["reason"]) == ("True", cond.REASON_NO_PROGRESS)
            assert "past step 5" in stall["message"]
            assert stalled["progress"]["currentStep"] == 5
            assert events.TRAINING_STALLED in event_reasons(kubeconfig, namespace, "stall")
            # One in-process restart and a save blocking 2 s: an interval is advised.
            advice = stalled["checkpointAdvice"]
            assert advice["saveCostSeconds"] == 2.0 and advice["faults"] == 1
            assert advice["configuredIntervalSteps"] == 100
            assert advice["recommendedIntervalSteps"] >= 1 and advice["recommendedIntervalSeconds"] > 0
            assert status_cli.main(["stall", "-n", namespace, "--kubeconfig", str(kubeconfig)]) == 0
            printed = capsys.readouterr().out
            assert "State:          Stalled" in printed and "by Young/Daly, configured 100" in printed
            wide = kubectl(kubeconfig, "-n", namespace, "get", "rtj", "stall", "-o", "wide").splitlines()
            assert wide[0].split()[-3:] == ["INTERVAL", "ADVISED", "STEPS-FROM"]
            assert wide[1].split()[-3:] == ["100", str(advice["recommendedIntervalSteps"]), "Library"]

            (checkpoint_dir(kubeconfig, namespace, "stall") / "resume").touch()

            def unstalled() -> dict[str, object] | None:
                status = job_status(kubeconfig, namespace, "stall")
                return status if condition(status, "Stalled")["status"] == "False" else None

            resumed = wait_for(
                unstalled,
                timeout=120,
                interval=1,
                message="the stall to clear",
            )
            assert condition(resumed, "Stalled")["reason"] == events.TRAINING_RESUMED
            assert resumed["state"] == "Running"
            assert events.TRAINING_RESUMED in event_reasons(kubeconfig, namespace, "stall")

            # A pod replaced by the operator: the recovery ends with the replacement's first step.
            kubectl(kubeconfig, "-n", namespace, "delete", "pod", "stall-worker-0", "--wait=false")
            recovered = wait_for(
                lambda: s if (s := job_status(kubeconfig, namespace, "stall")).get("lastRecovery") else None,
                timeout=180,
                interval=1,
                message="the recovery to end",
            )
            last = recovered["lastRecovery"]
            assert last["reason"] == events.WORKER_DISRUPTED
            ready_again = parse_rfc3339(condition(recovered, "Ready")["lastTransitionTime"])
            resume, fault = parse_rfc3339(last["resumeTime"]), parse_rfc3339(last["faultTime"])
            assert ready_again is not None and resume is not None and fault is not None
            # The pod was ready before training was: the recovery lasted past its first-step delay.
            assert resume > ready_again and last["durationSeconds"] >= FIRST_STEP_DELAY
            assert condition(recovered, "Recovering")["reason"] == events.JOB_RECOVERED
            assert recovered["state"] == "Running"
            print(f"last recovery: {last}")
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


TRAIN_STEPS = 400
TRAINER_STALL_AFTER_SECONDS = 60


@pytest.mark.local_cluster(nodes=2, profile="cpu")
def test_the_real_trainer_hung_past_every_timeout_is_stalled_and_advised_after_its_restart(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    """rtj-train under ft_launcher (1 pod x 1 rank): an exception at step 4 is recovered in-process
    (a fault counted, checkpoints every 2 steps measured), then a hang at step 8 outlasts every
    timeout of the trainer's layers: the operator reports the job Stalled while its pod is Ready."""
    kubeconfig = local_cluster.kubeconfig_path
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    manifest = job_manifest(
        "hang",
        namespace,
        nodes=1,
        processesPerNode=1,
        command=["rtj-train"],
        args=["--steps", str(TRAIN_STEPS), "--step-sleep", "0.2", "--hidden", "32", "--layers", "1"],
        checkpoint={"intervalSteps": 2},
        env=[
            {"name": "RTJ_PROGRESS_INTERVAL_SECONDS", "value": "1"},
            {"name": "RTJ_FAULTS", "value": "exception@step=4,rank=0;hang@step=8,rank=0"},
        ],
        # Longer than the test: nothing of the trainer's recovers the hang.
        faultTolerance={
            "heartbeatTimeoutSeconds": 1200,
            "initialHeartbeatTimeoutSeconds": 1200,
            "inProcess": {"softTimeoutSeconds": 900, "hardTimeoutSeconds": 1000},
        },
        # Above what ft_launcher, torch's import and the rendezvous take here before the first step.
        progress={"stallAfterSeconds": TRAINER_STALL_AFTER_SECONDS},
    )
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            apply(kubeconfig, manifest, tmp_path)

            def hung() -> dict[str, Any] | None:
                # A start slower than the stall time (a loaded machine) is a stall of its own, cleared
                # by the first step: wait for the one at the hang, after the restart at step 4.
                status = job_status(kubeconfig, namespace, "hang")
                step = (status.get("progress") or {}).get("currentStep") or 0
                return status if status.get("state") == "Stalled" and step > 4 else None

            stalled = wait_for(hung, timeout=400, interval=1, message="the hung job to be Stalled")
            assert condition(stalled, "Ready")["status"] == "True"
            # The hang fires as step 9 starts; the trainer's live report goes out at most once a
            # second, so the last step it showed may be a few short of 8.
            step = stalled["progress"]["currentStep"]
            assert 4 < step <= 8 and f"past step {step} " in condition(stalled, "Stalled")["message"]
            assert stalled["restarts"]["inProcess"] == 1
            assert events.TRAINING_STALLED in event_reasons(kubeconfig, namespace, "hang")
            advice = stalled["checkpointAdvice"]
            assert advice["faults"] == 1 and advice["saveCostSeconds"] > 0
            assert advice["configuredIntervalSteps"] == 2 and advice["recommendedIntervalSteps"] >= 1
            print(f"stalled at step {step}; checkpoint advice: {advice}")
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
