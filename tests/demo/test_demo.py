"""`rtj demo`: its options, fault plan and job manifest, and a shortened rehearsal end to end."""

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rtj_demo import configurations, processes
from rtj_demo.demo import fault_plan, job_settings, parse_args
from rtj_demo.rehearsal import JobSettings, PlannedFault, build_job, load_example, observe, rtj_faults
from rtj_demo.report import INTENDED_LAYER, LAYER_IN_PROCESS
from rtj_operator import events
from rtj_operator.api import parse_job


def test_the_demo_runs_the_recommended_job_and_loses_worker_1s_node_then_worker_0s() -> None:
    args = parse_args(["--quick"])
    assert (args.steps, args.launcher) == (120, "Supervisor")
    plan = fault_plan(args.steps, args.launcher)
    assert [f.kind for f in plan] == ["exception", "sigkill", "hang", "node-loss", "node-loss"]
    assert [f.worker for f in plan if f.kind == "node-loss"] == [1, 0]
    assert [f.step for f in plan] == sorted({f.step for f in plan})
    assert all(0 < f.step < args.steps for f in plan)
    # Each fault sits mid-way between two checkpoints (every 8 steps here).
    assert all(f.step % 8 == 4 for f in plan)
    assert rtj_faults(plan) == "exception@step=12,rank=1;sigkill@step=36,rank=2;hang@step=60,rank=3"
    # Two workers, two hot spares, the store pod, a node for each of the two lost, one more.
    assert args.nodes == 8
    job = build_job(load_example(), job_settings(args, plan), rendezvous_port=31234)
    spec = parse_job(job).spec
    assert spec.fault_tolerance.launcher == "Supervisor" and spec.hot_spares == 2
    assert spec.checkpoint.memory_interval_steps == 1 and spec.checkpoint.mode == "Async"
    assert job["spec"]["args"][job["spec"]["args"].index("--step-sleep") + 1] == "0.1"
    # Every fault, each node loss included, is for the processes that survive it to recover.
    assert dict(configurations.RECOMMENDED.intended) == dict.fromkeys(INTENDED_LAYER, LAYER_IN_PROCESS)


def test_the_default_launcher_keeps_its_four_faults_and_layers() -> None:
    args = parse_args(["--quick", "--launcher", "FtLauncher"])
    plan = fault_plan(args.steps, args.launcher)
    assert [f.kind for f in plan] == ["exception", "sigkill", "hang", "node-loss"]
    assert [f.worker for f in plan if f.kind == "node-loss"] == [1]  # worker 0's is a gang restart
    assert rtj_faults(plan) == "exception@step=20,rank=1;sigkill@step=44,rank=2;hang@step=68,rank=3"
    assert args.nodes == 4
    assert dict(configurations.DEFAULT.intended) == INTENDED_LAYER
    spec = parse_job(build_job(load_example(), job_settings(args, plan), rendezvous_port=31234)).spec
    assert spec.fault_tolerance.launcher == "FtLauncher" and spec.hot_spares == 0


def test_the_default_launcher_with_its_rendezvous_in_a_store_pod_loses_worker_0s_node() -> None:
    args = parse_args(["--quick", "--launcher", "FtLauncher", "--rendezvous-host", "StorePod"])
    plan = fault_plan(args.steps, args.launcher, args.rendezvous_host)
    assert [f.kind for f in plan] == ["exception", "sigkill", "hang", "node-loss"]
    assert [f.worker for f in plan if f.kind == "node-loss"] == [0]
    # Two workers, the store pod, a node for the one lost, one more.
    assert args.nodes == 5
    spec = parse_job(build_job(load_example(), job_settings(args, plan), rendezvous_port=31234)).spec
    assert spec.fault_tolerance.launcher == "FtLauncher" and spec.rendezvous.host == "StorePod"
    assert configurations.chosen("FtLauncher", "StorePod").intended == configurations.DEFAULT.intended
    with pytest.raises(SystemExit):
        parse_args(["--rendezvous-host", "StorePod"])  # Supervisor always has its store pod


def test_the_default_launcher_with_standby_spares_loses_the_node_of_a_pod_that_trains(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = fault_plan(120, "FtLauncher", "StorePod", "Standby")
    # Which pods train is the rendezvous' choice: the loss takes a training pod's node, whichever.
    assert [(f.kind, f.worker) for f in plan][-1] == ("node-loss", None)
    configuration = configurations.chosen("FtLauncher", "StorePod", "Standby")
    assert configuration is configurations.DEFAULT_WITH_STANDBY_SPARES
    assert configuration.intended["node-loss"] == "in-job"  # a standby node takes its place
    assert configurations.of_patch(configuration.spec_patch) is configuration
    # Two workers, the standby spare, the store pod, a node for the one lost, one more.
    assert configurations.cluster_nodes([configuration.spec_patch], 1, 2) == 6
    spec = parse_job(
        build_job(
            load_example(),
            JobSettings(
                name="demo", steps=120, checkpoint_interval=8, plan=plan, spec_patch=configuration.spec_patch
            ),
            rendezvous_port=31234,
        )
    ).spec
    assert (spec.rendezvous.host, spec.rendezvous.spares, spec.hot_spares) == ("StorePod", "Standby", 1)
    with pytest.raises(SystemExit):
        parse_args(["--launcher", "FtLauncher", "--spares", "Standby"])  # only with the store pod
    standby = ["--launcher", "FtLauncher", "--rendezvous-host", "StorePod", "--spares", "Standby"]
    if configurations.standby_capable_nvrx():
        assert parse_args(standby).nodes == 6
        return
    with pytest.raises(SystemExit):
        parse_args(standby)  # .venv's NVRx 0.4.1 has no standby nodes
    assert "PYTHONPATH=.venv/nvrx-0.7.0" in capsys.readouterr().err


def test_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--steps", "10"])
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "7"])  # the Supervisor job needs 8
    with pytest.raises(SystemExit):
        parse_args(["--launcher", "FtLauncher", "--nodes", "3"])
    with pytest.raises(SystemExit):
        parse_args(["--launcher", "Elastic"])
    with pytest.raises(SystemExit):
        parse_args(["--step-sleep", "-1"])
    assert parse_args(["--steps", "500"]).steps == 500
    assert parse_args(["--launcher", "FtLauncher", "--nodes", "4"]).nodes == 4


SIGTERMED_RUN = """
import subprocess, sys, time
from rtj_demo import processes
run_id = processes.tag_environment()
processes.clean_up_on_sigterm()
try:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("running", flush=True)
    time.sleep(600)
finally:
    print("cleaned up", len(processes.reap(run_id, timeout=0)), flush=True)
"""


def test_a_run_sent_sigterm_cleans_up_as_on_ctrl_c() -> None:
    """`rtj demo` and `rtj bench` under SIGTERM (a `timeout`, a cancelled CI job) go through their
    clean-up, so the processes they started (here a stand-in for the local cluster's) do not outlive
    them."""
    run_id = uuid.uuid4().hex
    env = {**os.environ, processes.RUN_TAG: run_id}
    run = subprocess.Popen([sys.executable, "-c", SIGTERMED_RUN], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None and run.stdout.readline().strip() == "running"
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 128 + signal.SIGTERM
        assert run.stdout.read().strip() == "cleaned up 1"
        assert processes.tagged_processes(run_id) == []
    finally:
        run.kill()
        run.wait()
        if run.stdout is not None:
            run.stdout.close()
        processes.reap(run_id, timeout=0)


def test_job_manifest_is_the_example_with_the_rehearsals_settings() -> None:
    settings = JobSettings(
        name="demo",
        steps=77,
        checkpoint_interval=7,
        checkpoint_mode="Sync",
        in_process=False,
        max_in_job_restarts=0,
        plan=[PlannedFault("sigkill", 30, rank=2), PlannedFault("node-loss", 50)],
    )
    job = build_job(load_example(), settings, rendezvous_port=31234)
    parsed = parse_job(job)  # still a valid job for the operator
    assert parsed.spec.rendezvous.port == 31234
    spec = job["spec"]
    assert spec["args"][spec["args"].index("--steps") + 1] == "77"
    assert spec["args"].count("--steps") == 1
    assert spec["checkpoint"]["intervalSteps"] == 7 and spec["checkpoint"]["mode"] == "Sync"
    assert spec["faultTolerance"]["maxInJobRestarts"] == 0
    assert spec["faultTolerance"]["inProcess"]["enabled"] is False
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert env["RTJ_FAULTS"] == "sigkill@step=30,rank=2"
    # The progress file is relative to the working directory, the checkpoint mount.
    assert spec["workingDir"] == spec["checkpoint"].get("mountPath", "/checkpoints")
    # Every step goes to the timeline file (its own cadence, 0); the progress endpoint (the operator's
    # input) and the node state once a second.
    assert env["RTJ_PROGRESS_SINK"] == "endpoint,file:demo/progress.jsonl@0"
    assert env["RTJ_PROGRESS_INTERVAL_SECONDS"] == "1"


def test_live_view_takes_whichever_source_is_further_along() -> None:
    status = {"state": "Recovering", "restarts": {"inProcess": 0, "inJob": 1, "podReplacement": 1}}
    record = {"step": 42, "restarts": {"inProcess": 2, "inJob": 1}, "lastCheckpoint": {"step": 40}}
    obs = observe(status, record, 12.0)
    assert (obs.step, obs.state, obs.checkpoint_step) == (42, "Recovering", 40)
    assert obs.restarts == {"in-process": 2, "in-job": 1, "pod": 1}
    empty = observe({}, {}, 0.0)
    assert (empty.step, empty.state, empty.checkpoint_step) == (0, "Pending", None)


# NVRx 0.7.0's modules beside .venv's 0.4.1 (the Makefile's NVRX_0_7): first on the path of a demo
# whose pods need it (standby spares).
NVRX_0_7_PATH = Path(sys.prefix) / "nvrx-0.7.0"


def run_quick_demo(
    tmp_path: Path, *options: str, env_extra: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`rtj demo --quick` with `options` in a process of its own (its environment and its pods' with
    `env_extra`): its result and report, once it exited 0 and left no process of its run behind."""
    run_id = uuid.uuid4().hex
    out = tmp_path / "demo"
    env = {**os.environ, processes.RUN_TAG: run_id, "PYTHONWARNINGS": "ignore", **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, "-m", "rtj_operator.cli", "demo", "--quick", *options, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    leftovers = processes.tagged_processes(run_id)
    processes.reap(run_id, timeout=0)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert not leftovers, processes.describe(leftovers)
    data: dict[str, Any] = json.loads((out / "report.json").read_text())
    return done, data


@pytest.mark.slow
def test_quick_demo_recovers_every_fault_in_process_worker_0s_node_included_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The recommended job end to end (`rtj demo --quick`): an exception, a SIGKILLed rank, a hang,
    the loss of worker 1's node and then of worker 0's are each recovered in-process by the
    processes that survive them, no step lost (the second node loss from the replicas the first's
    spare holds); the operator replaces each lost worker once (the replacement stands by as a
    spare) and never restarts the gang; nothing is left running."""
    done, data = run_quick_demo(tmp_path)
    assert data["ok"] and data["problems"] == [] and data["launcher"] == "Supervisor"
    report = data["report"]
    kinds = ["exception", "sigkill", "hang", "node-loss", "node-loss"]
    assert [f["kind"] for f in report["faults"]] == kinds
    for fault in report["faults"]:
        # A node whose pod's ranks had all moved to the spares' reserve ranks by then (the SIGKILL
        # moves rank 2's index, a hang past the hard timeout on a loaded machine rank 3's) interrupts
        # nothing: no layer acts, and the report says so rather than a recovery.
        nothing = fault["kind"] == "node-loss" and fault["recovered_by"] is None and fault["as_intended"]
        assert fault["recovered_by"] == LAYER_IN_PROCESS or nothing, fault
        assert fault["recovery_seconds"] > 0 and fault["steps_lost"] == 0, fault
    assert report["final_step"] == 120
    status = data["status"]
    assert status["restarts"]["podReplacement"] == 2, status["restarts"]
    assert len({f["nodeName"] for f in status["nodeFaults"]}) == 2, status["nodeFaults"]
    reasons = {e["reason"] for e in data["events"]}
    assert events.WORKER_REPLACED in reasons and events.GANG_RESTART not in reasons, reasons
    assert (tmp_path / "demo" / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "every fault was recovered by its intended layer" in done.stdout


@pytest.mark.slow
def test_quick_demo_of_the_default_launcher_with_a_store_pod_replaces_worker_0_alone(tmp_path: Path) -> None:
    """The default launcher end to end with its rendezvous in a store pod (`rtj demo --quick
    --launcher FtLauncher --rendezvous-host StorePod`): the exception and the hang in-process, the
    SIGKILL by ft_launcher, and worker 0's node by one pod replacement, its ft_launcher's peers
    staying up and taking the replacement into the next rendezvous round: no gang restart."""
    _, data = run_quick_demo(tmp_path, "--launcher", "FtLauncher", "--rendezvous-host", "StorePod")
    assert data["ok"] and data["launcher"] == "FtLauncher"
    faults = {f["kind"]: f for f in data["report"]["faults"]}
    assert faults["node-loss"]["recovered_by"] == "pod-replacement", faults["node-loss"]
    status = data["status"]
    assert status["restarts"]["podReplacement"] == 1, status["restarts"]
    assert [p.get("worker") for p in data["plan"] if p["kind"] == "node-loss"] == [0]
    # The store pod hosted the rendezvous throughout, on a node that was not lost.
    assert status["store"]["podName"] == "demo-store", status.get("store")
    assert status["store"]["nodeName"] not in {f["nodeName"] for f in status["nodeFaults"]}
    reasons = {e["reason"] for e in data["events"]}
    assert events.NODE_LOST in reasons and events.GANG_RESTART not in reasons, reasons


@pytest.mark.slow
def test_quick_demo_with_a_standby_spare_recovers_the_node_loss_without_waiting_for_a_pod(
    tmp_path: Path,
) -> None:
    """The default launcher on NVRx 0.7.0 with its hot spare standing by in the store pod's rendezvous
    (`rtj demo --quick --launcher FtLauncher --rendezvous-host StorePod --spares Standby`, 0.7.0 on
    the demo's and so the pods' path): the node of a pod that trains is lost, and a standby node
    takes its place in ft_launcher's next round (an in-job restart) while the operator replaces the
    lost pod elsewhere, never on the spare's node; no gang restart."""
    assert (NVRX_0_7_PATH / "nvidia_resiliency_ext").is_dir(), f"{NVRX_0_7_PATH}: run make setup"
    options = ("--launcher", "FtLauncher", "--rendezvous-host", "StorePod", "--spares", "Standby")
    _, data = run_quick_demo(tmp_path, *options, env_extra={"PYTHONPATH": str(NVRX_0_7_PATH)})
    assert data["ok"] and data["problems"] == [], data["problems"]
    faults = {f["kind"]: f for f in data["report"]["faults"]}
    assert faults["node-loss"]["recovered_by"] == "in-job", faults["node-loss"]
    # The lost pod (a worker's or the spare's, whichever trained there) was replaced, its node
    # recorded once; no spare's node was given up for it and no gang restarted.
    assert len(data["status"]["nodeFaults"]) == 1, data["status"]["nodeFaults"]
    reasons = {e["reason"] for e in data["events"]}
    assert events.NODE_LOST in reasons, reasons
    assert events.GANG_RESTART not in reasons and events.SPARE_USED not in reasons, reasons
