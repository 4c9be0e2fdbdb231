"""A training script of the user's own under rtj-launch and ft_launcher, on one "node": NVRx's public
API only (RankMonitorClient heartbeats), no rtj library, its step declared by a log-line pattern.
The pod's endpoint still shows the in-job restart and its recovery, the step and loss from the
pattern, and where each figure comes from; a wrong script path ends the pod at the second try with
exit 78 and a StartupFailed termination message, and a script that raises at the same step on every
try ends it at the second try with exit 93 and a DeterministicFailure one, instead of spending
ft_launcher's restarts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rtj_localcluster.ports import reserve_port
from trainer_launch_support import kill_nodes

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
STEPS = 8

# The user's script: heartbeats through NVRx's RankMonitorClient, a log line per step, and rank 1
# crashes once, at step 3 of the first try.
OWN_SCRIPT = """
import os, sys, time
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

steps = int(sys.argv[1])
rank = int(os.environ["RANK"])
first_try = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
client = RankMonitorClient()
client.init_workload_monitoring()
for step in range(1, steps + 1):
    time.sleep(0.2)
    client.send_heartbeat()
    print(f"rank {rank}: step {step} loss {1.0 / step:.4f}")
    if rank == 1 and first_try and step == 3:
        print("rank 1: simulated crash", file=sys.stderr)
        sys.exit(1)
client.shutdown_workload_monitoring()
"""
PATTERN = r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)"


def launcher_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    rdzv = reserve_port()
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TMPDIR": str(tmp_path),
        "RTJ_JOB_UID": f"own-{rdzv}",
        "RTJ_RDZV_HOST": "127.0.0.1",
        "RTJ_RDZV_PORT": str(rdzv),
        "RTJ_POD_IP": "127.0.0.1",
        "RTJ_NNODES": "1",
        "RTJ_NPROC_PER_NODE": "2",
        "RTJ_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS": "30",
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS": "60",
        "RTJ_FT_MONITOR_INTERVAL_SECONDS": "1",
        "RTJ_MAX_RESTARTS": "5",
        "RTJ_PROGRESS_PORT": str(port),
        "RTJ_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log"),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def read_progress(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=5) as response:
            loaded: dict[str, Any] = json.loads(response.read())
            return loaded
    except (OSError, urllib.error.HTTPError, ValueError):
        return None


def run_and_watch(
    tmp_path: Path, command: list[str], timeout: float, **extra: str
) -> tuple[int, list[dict[str, Any]], str]:
    """rtj-launch's exit status, every report read from its endpoint while it ran, and its log."""
    port = reserve_port()
    log_path = tmp_path / "launch.log"
    reports: list[dict[str, Any]] = []
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [str(BIN / "rtj-launch"), "--", *command],
            env=launcher_env(tmp_path, port, **extra),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()[-4000:]
            report = read_progress(port)
            if report is not None:
                reports.append(report)
            time.sleep(0.3)
    finally:
        kill_nodes([proc])  # ft_launcher's workers too, in sessions of their own
    return proc.returncode, reports, log_path.read_text(errors="replace")


def test_an_own_script_gets_its_restart_recovery_and_steps_reported(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(OWN_SCRIPT)
    code, reports, log = run_and_watch(
        tmp_path,
        ["python", str(script), str(STEPS)],
        timeout=120,
        RTJ_STEP_LOG_PATTERN=PATTERN,
        # ft_launcher's config file from the spec: parsed by the release under test.
        RTJ_FT_CONFIG="fault_tolerance:\n  workload_check_interval: 1.0\n",
        # The final report must be read before the pod goes (this test reads every 0.3 s).
        RTJ_PROGRESS_LINGER_SECONDS="30",
    )
    assert code == 0, log[-4000:]
    # The ranks' own output reaches the container's log.
    assert "rank 1: simulated crash" in log and f"rank 0: step {STEPS} loss" in log
    assert "--ft-cfg-path=" in log
    running = [r for r in reports if r["ranks"]["running"] == 2]
    assert running, reports[-3:]
    assert all(r["sources"]["restarts"] == "Launcher" and "library" not in r for r in reports)
    final = reports[-1]
    assert final["sources"] == {"step": "LogPattern", "restarts": "Launcher"}
    assert (final["step"], final["loss"]) == (STEPS, pytest.approx(1 / STEPS, abs=1e-4))
    assert final["restarts"] == {"inProcess": 0, "inJob": 1}
    assert final["ranks"]["running"] == 0 and final["ranks"]["restartCount"] == 1
    assert final["finished"] is False and "lastCheckpoint" not in final
    [event] = final["events"]
    assert (event["kind"], event["source"], event["step"], event["resumedFrom"]) == (
        "InJobRestart",
        "Launcher",
        1,
        "unknown",
    )
    # From rank 1's exit to the new generation's first matched step.
    assert 0 < event["recoverySeconds"] < 60
    assert event["faultEpoch"] < event["recoveredEpoch"]


def test_a_wrong_script_path_fails_at_the_second_try(tmp_path: Path) -> None:
    started = time.monotonic()
    missing = tmp_path / "missing" / "train.py"
    code, reports, log = run_and_watch(tmp_path, ["python", str(missing)], timeout=90)
    assert code == 78, log[-4000:]
    first, second = (tmp_path / "termination-log").read_text().splitlines()
    assert first == "FaultReason: StartupFailed"
    prefix = "the training command failed the same way on 2 tries before its first step: exit 2: "
    assert second.startswith(prefix) and "can't open file" in second, second
    # ft_launcher had 5 restarts left: rtj-launch stopped it after the second try.
    assert reports and max(r["ranks"]["restartCount"] for r in reports) <= 2
    assert time.monotonic() - started < 60


# A script of the user's own on the library: rank 1 fails at step 4 on every try, by a bad batch
# (an exception) or by a NaN loss (the session raises NonFiniteLossError rather than count the step).
BAD_STEP_SCRIPT = """
import os, time
import rtj_trainer

rank = int(os.environ["RANK"])
with rtj_trainer.Session() as session:
    start, _ = session.load()
    for step in range(start + 1, 9):
        time.sleep(0.3)
        if rank == 1 and step == 4 and "{failure}" == "exception":
            raise ValueError(f"bad batch in shard {{os.getpid() % 7}}")
        loss = float("nan") if rank == 1 and step == 4 else 1.0 / step
        session.step(step, loss=loss)
"""
BAD_STEP_ERRORS = {
    "exception": "ValueError: bad batch in shard",
    "nan": "rtj_trainer.NonFiniteLossError: the loss of step 4 is nan: not training on it",
}


@pytest.mark.parametrize("failure", sorted(BAD_STEP_ERRORS))
def test_a_script_that_fails_at_the_same_step_on_every_try_stops_at_the_second(
    tmp_path: Path, failure: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(BAD_STEP_SCRIPT.format(failure=failure))
    code, reports, log = run_and_watch(tmp_path, ["python", str(script)], timeout=120)
    assert code == 93, log[-4000:]
    first, second = (tmp_path / "termination-log").read_text().splitlines()
    assert first == "FaultReason: DeterministicFailure"
    prefix = "the training failed the same way after step 3 on 2 tries in a row: exit 1: "
    assert second.startswith(prefix + BAD_STEP_ERRORS[failure]), second
    # Both tries' tracebacks end with the library's note. ft_launcher had 5 restarts left: stopped at
    # the second try, or at the third (on a loaded machine the fourth) when ft_launcher started it
    # before rtj-launch's next read of the rank records; never at ft_launcher's own limit.
    assert log.count("rtj_trainer: failed after step 3") >= 2, log[-4000:]
    assert reports and max(r["ranks"]["restartCount"] for r in reports) <= 3
