"""A training script of one's own under the operator, on the local cluster: `examples/byo/train.py`,
written against torch and NVRx's public API only, the same file in every run, started as
`command: [python, train.py]` (ft_launcher runs it with --no-python).

What a user must see without changing the script: the job completes; a SIGKILLed rank is an in-job
restart that status counts and times to the ranks' next step; a lost node is recovered and the
recovery ends when training is seen again, not when the pods are Ready; the step comes from the
log-line pattern the spec declares; a job that reports no step is never Stalled for it; NVRx's
sections API works with an ft_launcher config given in the spec; a wrong script path fails the
job within three tries, naming the path, with consistent conditions; and a script on the library that
raises at the same step on every try fails the job after two (DeterministicFailure, naming the step
and the error), spending no budget.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from operator_cluster import apply, event_reasons, install_crd, job_manifest, job_status, pods, wait_state
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.kubelet import MARK_POD
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator import events, names
from rtj_operator.decide import conditions as cond
from rtj_operator.main import EmbeddedOperator

pytestmark = [pytest.mark.slow]

CHECKPOINT_DIR = "$(RTJ_CHECKPOINT_DIR)"  # expanded by the kubelet, as a user would write it
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "byo" / "train.py"
STEP_PATTERN = r"^step (?P<step>\d+) loss (?P<loss>[0-9.eE+-]+)"


def _own_script_job(
    name: str, *, args: list[str], command: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A job that runs the script as its users would: no rtj-train, no RTJ_* settings of the trainer."""
    job = job_manifest(
        name,
        "default",
        nodes=2,
        command=command or [sys.executable, str(SCRIPT)],
        args=args,
        env=spec.pop("env", []),
        rendezvous={"port": reserve_port()},
        faultTolerance={
            "heartbeatTimeoutSeconds": 30,
            "initialHeartbeatTimeoutSeconds": 120,
            "monitorIntervalSeconds": 1,
            "inProcess": {"enabled": False},
            **spec.pop("faultTolerance", {}),
        },
        terminationGracePeriodSeconds=10,
        **spec,
    )
    return job


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def _training_processes(pod_uid: str) -> list[psutil.Process]:
    """The script's processes of one pod (not the rank shim nor ft_launcher)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK_POD) != pod_uid:
                continue
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if cmdline[:2] == [sys.executable, str(SCRIPT)]:
            found.append(proc)
    return found


def _step(status: dict[str, Any]) -> int:
    return int((status.get("progress") or {}).get("step") or 0)


def _watch_no_stall(kubeconfig: Path, name: str, seen: list[str]) -> dict[str, Any]:
    status = job_status(kubeconfig, "default", name)
    stalled = _condition(status, cond.COND_STALLED)
    if stalled.get("status") == "True":
        seen.append(str(stalled))
    return status


def _until(
    kubeconfig: Path,
    name: str,
    stalls: list[str],
    done: Callable[[dict[str, Any]], bool],
    *,
    timeout: float,
    message: str,
) -> dict[str, Any]:
    """The job's status once `done` holds, noting every Stalled=True seen on the way."""
    return wait_for(
        lambda: s if done(s := _watch_no_stall(kubeconfig, name, stalls)) else None,
        timeout=timeout,
        message=message,
    )


@pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=10.0)
def test_own_script_is_seen_through_a_killed_rank_and_a_lost_node(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    name = "own"
    # A step every 0.2 s or so: the faults come at the test's own pace (after step 30, each once the
    # previous recovery shows in status, near step 60-80), and the job must still be running then.
    steps = 200
    stalls: list[str] = []
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = _own_script_job(
            name,
            args=["--steps", str(steps), "--step-sleep", "0.2", "--ckpt-dir", CHECKPOINT_DIR],
            # A stall would be the operator blind to steps that come every 0.2 s; 180 s leaves room
            # for the node loss's recovery on a loaded 2-core machine (once, beside two other lanes'
            # start, no step came for over 60 s through it).
            progress={"stallAfterSeconds": 180, "stepLogPattern": STEP_PATTERN},
            failurePolicy={"nodeLossGraceSeconds": 3, "backoffSeconds": 1},
        )
        apply(kc, job, tmp_path)
        status = _until(kc, name, stalls, lambda s: _step(s) >= 30, timeout=300, message="30 steps in status")
        assert status["progress"]["sources"]["step"] == "LogPattern"
        assert status["progress"]["sources"]["restarts"] == "Launcher"

        # A rank's SIGKILL: ft_launcher restarts the workers; status counts it and times it.
        victim = pods(kc, "default", name)[names.worker_pod_name(name, 1)]
        processes = _training_processes(victim["metadata"]["uid"])
        assert processes, "no training process found in worker 1"
        killed_at = time.time()
        processes[0].send_signal(signal.SIGKILL)
        status = _until(
            kc,
            name,
            stalls,
            lambda s: (
                (s.get("restarts") or {}).get("inJob", 0) >= 1
                and (s.get("lastRecovery") or {}).get("reason") == "InJobRestart"
            ),
            timeout=300,
            message="the in-job restart in status",
        )
        in_job = status["lastRecovery"]
        assert in_job["durationSeconds"] > 0
        assert in_job["durationSeconds"] < time.time() - killed_at + 5

        # A lost node: the recovery ends with the ranks' next step, not with pods Ready.
        step_before = _step(status)
        lost = pods(kc, "default", name)[names.worker_pod_name(name, 1)]["spec"]["nodeName"]
        local_cluster.kill_node(lost)
        status = _until(
            kc,
            name,
            stalls,
            lambda s: (s.get("lastRecovery") or {}).get("reason") == events.NODE_LOST,
            timeout=420,
            message="the node loss's recovery to end",
        )
        final = _until(
            kc, name, stalls, lambda s: s.get("state") == "Succeeded", timeout=600, message="success"
        )
    recovery = status["lastRecovery"]
    # The recovery ended when a step was seen again after the fault, not when the replacement pod
    # was Ready (about a second after its creation here; its ranks start, import torch and meet in a
    # new rendezvous round first).
    assert recovery["durationSeconds"] > 5, recovery
    assert final["progress"]["step"] == steps
    assert final["restarts"]["inJob"] >= 2  # the killed rank, and the gang's restart after the node loss
    assert final["restarts"]["podReplacement"] >= 1
    assert step_before < steps
    assert not stalls, stalls
    assert events.TRAINING_STALLED not in event_reasons(kc, "default", name)


@pytest.mark.local_cluster(nodes=2, profile="cpu")
def test_sections_api_with_a_config_from_the_spec_and_no_steps_is_never_stalled(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    name = "sections"
    stalls: list[str] = []
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = _own_script_job(
            name,
            args=["--steps", "60", "--step-sleep", "0.2", "--sections", "--ckpt-dir", CHECKPOINT_DIR],
            progress={"stallAfterSeconds": 5},
            faultTolerance={
                # The script sends no heartbeats: only its section timeouts apply.
                "heartbeatTimeoutSeconds": 0,
                "initialHeartbeatTimeoutSeconds": 0,
                "ftLauncher": {
                    "config": {
                        "rank_section_timeouts": {"init": 180, "step": 30, "checkpointing": 60},
                        "rank_out_of_section_timeout": 60,
                    }
                },
            },
        )
        apply(kc, job, tmp_path)
        _until(
            kc,
            name,
            stalls,
            lambda s: (
                bool((s.get("progress") or {}).get("sources"))
                and _condition(s, cond.COND_READY).get("status") == "True"
            ),
            timeout=300,
            message="the workers' reports",
        )
        time.sleep(8)  # past stallAfterSeconds with every worker ready
        running = _watch_no_stall(kc, name, stalls)
        final = _until(
            kc,
            name,
            stalls,
            lambda s: s.get("state") in ("Succeeded", "Failed"),
            timeout=420,
            message="the job to end",
        )
    assert final["state"] == "Succeeded", final.get("conditions")
    assert running["progress"]["sources"]["step"] == "NotReported"
    stalled = _condition(running, cond.COND_STALLED)
    assert stalled.get("status") == "Unknown", stalled
    assert "stepLogPattern" in stalled.get("message", "")
    assert not stalls, stalls
    assert final["restarts"].get("inJob", 0) == 0  # no section timed out: the config was applied


# A script of the user's own on the library whose every rank raises at step 4, whatever the try.
BAD_BATCH = """
import time
import rtj_trainer

with rtj_trainer.Session() as session:
    start, _ = session.load()
    for step in range(start + 1, 20):
        time.sleep(0.1)
        if step == 4:
            raise ValueError("bad batch at offset 0x3f00")
        session.step(step, loss=1.0 / step)
"""


@pytest.mark.local_cluster(nodes=2, profile="cpu")
def test_a_wrong_script_path_and_a_step_that_always_raises_fail_the_job_naming_why(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    missing = "/app/trian.py"
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        apply(kc, _own_script_job("typo", args=[], command=[sys.executable, missing]), tmp_path)
        apply(kc, _own_script_job("badbatch", args=[], command=[sys.executable, "-c", BAD_BATCH]), tmp_path)
        typo = wait_state(kc, "default", "typo", "Failed", timeout=240)
        bad_batch = wait_state(kc, "default", "badbatch", "Failed", timeout=240)
    for final in (typo, bad_batch):
        assert _condition(final, cond.COND_READY).get("status") != "True", final["conditions"]
        assert (final.get("budget") or {}).get("failuresUsed", 0) == 0, final
    failed = _condition(typo, cond.COND_FAILED)
    assert failed.get("reason") == events.STARTUP_FAILED, failed
    assert missing in failed.get("message", ""), failed
    assert (typo.get("restarts") or {}).get("podReplacement", 0) <= 2
    # rtj-launch stopped ft_launcher at the second try (it had more), and nothing was replaced.
    failed = _condition(bad_batch, cond.COND_FAILED)
    assert failed.get("reason") == events.DETERMINISTIC_FAILURE, failed
    evidence = "after step 3 on 2 tries in a row: exit 1: ValueError: bad batch at offset 0x3f00"
    assert evidence in failed.get("message", ""), failed
    assert (bad_batch.get("restarts") or {}).get("podReplacement", 0) == 0, bad_batch


# The project's packages and their metadata in the virtual environment, which a user's image lacks.
PROJECT_SITE_ENTRIES = ("__editable__", "resilient_training_operator")


def _image_without_the_project(root: Path) -> Path:
    """A user's image as the local kubelet runs one: a virtual environment with this interpreter, torch,
    NVRx and their dependencies (linked from ours) and ft_launcher, but not this project's packages.
    Its bin directory goes first on the container's PATH, so `python3` is its interpreter."""
    env_dir = root / "user-image"
    # --copies: the interpreter itself, not a link into a directory (~root) that the pod user cannot
    # search, which shutil.which would skip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--copies", str(env_dir)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(
        subprocess.run(
            [
                str(env_dir / "bin" / "python3"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for entry in ours.iterdir():
        if not entry.name.startswith(PROJECT_SITE_ENTRIES) and not (theirs / entry.name).exists():
            (theirs / entry.name).symlink_to(entry)
    launcher = Path(sys.executable).with_name("ft_launcher").read_text().splitlines()[1:]
    ft_launcher = env_dir / "bin" / "ft_launcher"
    ft_launcher.write_text("\n".join([f"#!{env_dir / 'bin' / 'python3'}", *launcher]) + "\n")
    ft_launcher.chmod(0o755)
    return env_dir / "bin"


def _imports(python: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-I", "-c", code], check=False).returncode == 0


@pytest.mark.local_cluster(nodes=2, profile="cpu")
def test_an_image_without_the_project_runs_with_the_runtime_from_runtime_image(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    # Not under /tmp: the pod mounts its scratch volume there, as a user's image would not install.
    image_root = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="rtj-user-image-"))
    image_root.chmod(0o755)  # an image's files are the pod user's to read and run
    try:
        _run_an_image_without_the_project(kc, tmp_path, _image_without_the_project(image_root))
    finally:
        shutil.rmtree(image_root, ignore_errors=True)


def _run_an_image_without_the_project(kc: Path, tmp_path: Path, user_bin: Path) -> None:
    python = user_bin / "python3"
    assert _imports(python, "torch") and _imports(python, "nvidia_resiliency_ext")
    assert not _imports(python, "rtj_trainer"), "the user's image must not hold the project's package"
    name = "userimage"
    steps = 40
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = _own_script_job(
            name,
            args=["--steps", str(steps), "--step-sleep", "0.1", "--ckpt-dir", CHECKPOINT_DIR],
            command=["python3", str(SCRIPT)],
            image="user-train:1",
            runtimeImage="rtj-trainer:0.1.0",
            env=[{"name": "PATH", "value": f"{user_bin}:/usr/local/bin:/usr/bin:/bin"}],
            progress={"stepLogPattern": STEP_PATTERN},
        )
        apply(kc, job, tmp_path)
        worker = names.worker_pod_name(name, 0)
        running = wait_for(
            lambda: s if _started_or_failed(s := job_status(kc, "default", name)) else None,
            timeout=300,
            message="five steps in status",
        )
        assert running.get("state") != FAILED, running.get("conditions")
        log = kubectl(kc, "-n", "default", "logs", worker)
        final = wait_state(kc, "default", name, "Succeeded", timeout=300)
    # The launcher ran from the runtime the init container copied, with the image's interpreter.
    launched = re.search(r"rtj-launch \S+ from (\S+), Python (\S+)", log)
    assert launched is not None, log[-2000:]
    runtime_lib, interpreter = launched.groups()
    assert runtime_lib.endswith("/volumes/rtj-runtime/lib/rtj_trainer"), runtime_lib
    assert interpreter == str(user_bin / "python3"), interpreter
    assert final["progress"]["step"] == steps
    assert final["progress"]["sources"] == {"step": "LogPattern", "restarts": "Launcher"}
    pod = pods(kc, "default", name)[worker]
    assert pod["spec"]["initContainers"][0]["name"] == "install-runtime"
    assert pod["spec"]["containers"][0]["command"] == ["python3", "/opt/rtj/runtime/rtj-launch.py"]


FAILED = "Failed"


def _started_or_failed(status: dict[str, Any]) -> bool:
    return _step(status) >= 5 or status.get("state") == FAILED


LIBRARY_SCRIPT = SCRIPT.with_name("train_with_library.py")


def _wide_columns(kubeconfig: Path, name: str) -> dict[str, str]:
    """`kubectl get rtj -o wide`, header -> value, as a user reads it (an empty cell is blank, so
    each value is cut at its header's position)."""
    header, row = kubectl(kubeconfig, "-n", "default", "get", "rtj", name, "-o", "wide").splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


@pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=10.0)
def test_the_same_script_with_the_library_reports_everything_and_drains_at_its_step(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    kc = local_cluster.kubeconfig_path
    install_crd(kc)
    name = "lib"
    steps = 80
    with EmbeddedOperator(str(kc), namespaces=["default"]):
        job = _own_script_job(
            name,
            args=["--steps", str(steps), "--step-sleep", "0.3"],
            command=[sys.executable, str(LIBRARY_SCRIPT)],
            # No periodic checkpoint before the end: the only one in the middle is the drain's.
            checkpoint={"intervalSteps": 1000},
        )
        apply(kc, job, tmp_path)
        running = wait_for(
            lambda: (
                s
                if _step(s := job_status(kc, "default", name)) >= 10
                and (s.get("progress") or {}).get("goodputPercent")
                else None
            ),
            timeout=300,
            message="ten steps and a goodput in status",
        )
        columns = _wide_columns(kc, name)
        # As a node drain evicts it: a delete with the pod's grace period.
        kubectl(kc, "-n", "default", "delete", "pod", names.worker_pod_name(name, 1), "--wait=false")
        drained = wait_for(
            lambda: s if (s := job_status(kc, "default", name)).get("lastCheckpoint") else None,
            timeout=300,
            message="the drain's checkpoint in status",
        )
        final = wait_state(kc, "default", name, "Succeeded", timeout=600)
    assert running["progress"]["sources"] == {"step": "Library", "restarts": "Library"}
    assert running["progress"]["library"]
    # The script passes the job's samples (64 per rank) and tokens (32 per sample) of each step.
    batch, remainder = divmod(running["progress"]["samples"], running["progress"]["step"])
    assert remainder == 0 and batch >= 2 * 64 and batch % 64 == 0, running["progress"]
    assert running["progress"]["tokens"] == 32 * running["progress"]["samples"]
    assert running["progress"]["samplesPerSecond"] > 0 and running["progress"]["tokensPerSecond"] > 0
    assert int(columns["STEP"]) >= 10 and float(columns["GOODPUT"]) > 0, columns
    assert columns["STEPS-FROM"] == "Library", columns
    drain_step = drained["lastCheckpoint"]["step"]
    assert 10 <= drain_step < steps  # the step it was at, not an interval's
    assert final["progress"]["step"] == steps
    # Through the drain and restart: counted from the checkpoint on, neither lost nor counted twice.
    assert (final["progress"]["samples"], final["progress"]["tokens"]) == (steps * batch, steps * batch * 32)
    assert final["lastCheckpoint"]["step"] == steps
    assert final.get("checkpointAdvice"), final
    assert final["restarts"].get("inJob", 0) >= 1 or final["restarts"].get("podReplacement", 0) >= 1
    assert (final.get("lastRecovery") or {}).get("step", 0) >= drain_step
