"""`rtj demo`: its options, fault plan and job manifest, and a shortened rehearsal end to end."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rtj_demo import processes
from rtj_demo.demo import fault_plan, parse_args
from rtj_demo.rehearsal import JobSettings, PlannedFault, build_job, load_example, observe, rtj_faults
from rtj_demo.report import INTENDED_LAYER
from rtj_operator.api import parse_job


def test_quick_keeps_all_four_fault_classes_in_order() -> None:
    args = parse_args(["--quick"])
    assert args.steps == 120
    plan = fault_plan(args.steps)
    assert [f.kind for f in plan] == ["exception", "sigkill", "hang", "node-loss"]
    assert [f.step for f in plan] == sorted(f.step for f in plan)
    assert all(0 < f.step < args.steps for f in plan)
    # The trainer's share goes through RTJ_FAULTS; the node loss is the demo's own.
    # Each fault sits mid-way between two checkpoints (every 8 steps here).
    assert all(f.step % 8 == 4 for f in plan)
    assert rtj_faults(plan) == "exception@step=20,rank=1;sigkill@step=44,rank=2;hang@step=68,rank=3"


def test_options_are_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--steps", "10"])
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "2"])
    assert parse_args(["--steps", "500"]).steps == 500


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
    # Every step goes to the timeline file and to the progress endpoint (the operator's input).
    assert env["RTJ_PROGRESS_SINK"] == "endpoint,file:demo/progress.jsonl"
    assert env["RTJ_PROGRESS_INTERVAL_SECONDS"] == "0"


def test_live_view_takes_whichever_source_is_further_along() -> None:
    status = {"state": "Recovering", "restarts": {"inProcess": 0, "inJob": 1, "podReplacement": 1}}
    record = {"step": 42, "restarts": {"inProcess": 2, "inJob": 1}, "lastCheckpoint": {"step": 40}}
    obs = observe(status, record, 12.0)
    assert (obs.step, obs.state, obs.checkpoint_step) == (42, "Recovering", 40)
    assert obs.restarts == {"in-process": 2, "in-job": 1, "pod": 1}
    empty = observe({}, {}, 0.0)
    assert (empty.step, empty.state, empty.checkpoint_step) == (0, "Pending", None)


@pytest.mark.slow
def test_quick_demo_recovers_every_fault_by_its_layer_and_leaves_nothing(tmp_path: Path) -> None:
    run_id = uuid.uuid4().hex
    out = tmp_path / "demo"
    env = {**os.environ, processes.RUN_TAG: run_id, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "rtj_operator.cli", "demo", "--quick", "--out", str(out)],
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
    data = json.loads((out / "report.json").read_text())
    assert data["ok"] and data["problems"] == []
    report = data["report"]
    assert sorted(f["kind"] for f in report["faults"]) == sorted(INTENDED_LAYER)
    for fault in report["faults"]:
        assert fault["recovered_by"] == INTENDED_LAYER[fault["kind"]], fault
        assert fault["recovery_seconds"] > 0
    assert report["final_step"] == 120
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "every fault was recovered by its intended layer" in done.stdout
