"""The library a training script of one's own imports (docs/library.md): its facade imports nothing
heavy, steps (with their samples and tokens) reach the pod's endpoint file, a restarted process
continues the node's counters, a drain's SIGTERM becomes a drain and any other keeps the script's
handler, fault() names the reason the operator's failure rules match, and outside a pod it does
nothing and says what is missing.
None of it needs torch (checkpoints and drains across a process group: test_library_checkpoint.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import rtj_trainer
from rtj_operator.observe import container_fault
from rtj_trainer.library import drain, progress

FACADE_PROGRAM = """
import json, os, sys, threading
read = set()
environ_type = type(os.environ)
original = environ_type.__getitem__
def recording(self, key):
    read.add(key)
    return original(self, key)
environ_type.__getitem__ = recording
import rtj_trainer
# Every name but the checkpoint manager, which is made of torch (docs/library.md).
names = {n: type(getattr(rtj_trainer, n)).__name__ for n in rtj_trainer.__all__ if n != "CheckpointManager"}
rtj_trainer.Session()
seen = {
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
    "threads": threading.active_count(),
    "read": sorted(read - {"TORCH_CPP_LOG_LEVEL"}),
}
names["CheckpointManager"] = type(rtj_trainer.CheckpointManager).__name__
print(json.dumps(seen | {"names": names, "dir": dir(rtj_trainer)}))
"""


DRAIN_PROGRAM = """
import os, signal, sys
import rtj_trainer
seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))  # the script's own handler
with rtj_trainer.Session() as session:
    session.checkpoint_saved(5)  # a checkpoint the script wrote itself
    os.kill(os.getpid(), signal.SIGTERM)
    session.step(5, loss=0.5)
    print(f"draining={session.draining} handler={seen}", flush=True)
    if session.draining:
        session.drain(5)
print("left the block", flush=True)
"""


HEARTBEATS_PROGRAM = """
import os, sys
import rtj_trainer
def run():
    beats = rtj_trainer.Heartbeats()
    beats.beat()  # before connect(): nothing is sent
    beats.keepalive()
    try:
        beats.connect()
        outcome = "ok"
    except Exception as error:  # NVRx's client: no rank, no monitor to reach
        outcome = type(error).__name__
    beats.beat()
    beats.close()
    print(f"enabled={beats.enabled} connect={outcome}", flush=True)
run()
os.environ["FT_RANK_MONITOR_IPC_SOCKET"] = sys.argv[1]
run()
"""


def _clean_environ() -> dict[str, str]:
    launcher = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")
    return {k: v for k, v in os.environ.items() if not k.startswith("RTJ_") and k not in launcher}


@pytest.fixture
def no_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No operator or launcher environment; the working directory is an empty temporary one."""
    for name in os.environ.keys() - _clean_environ().keys():
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def pod(no_pod: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What rtj-launch gives its training processes (no drain file: SIGTERM stays as it is)."""
    monkeypatch.setenv("RTJ_PROGRESS_FILE", str(no_pod / "progress.json"))
    monkeypatch.setenv("RTJ_CHECKPOINT_DIR", str(no_pod / "checkpoints"))
    monkeypatch.setenv("RTJ_NODE_RANK", "1")
    monkeypatch.setenv("RTJ_NNODES", "2")
    monkeypatch.setenv("RTJ_TERMINATION_MESSAGE_PATH", str(no_pod / "termination-log"))
    return no_pod


def _report(directory: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((directory / "progress.json").read_text())
    return loaded


def test_importing_the_library_starts_nothing_and_reads_no_environment() -> None:
    result = subprocess.run(
        [sys.executable, "-c", FACADE_PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    seen = json.loads(result.stdout)
    assert seen["torch"] == [], "importing rtj_trainer (or making a Session) imported torch"
    assert seen["threads"] == 1
    assert seen["read"] == [], "the environment is read only when a session starts"
    assert seen["names"] == {
        "CheckpointManager": "type",
        "DrainRequest": "type",
        "Heartbeats": "type",
        "InProcessUnavailableError": "type",
        "JobSettings": "type",
        "NodeFaults": "type",
        "NonFiniteLossError": "type",
        "LIBRARY_VERSION": "str",
        "Progress": "type",
        "RecoveryEvent": "type",
        "Reporter": "type",
        "Session": "type",
        "WORLD_BROKEN_EXIT_CODE": "int",
        "WORLD_FINISHED_KEY": "str",
        "WORLD_FORMED_KEY": "str",
        "__version__": "str",
        "in_process_available": "function",
        "in_process_layer": "function",
        "install_drain_handler": "function",
        "load_node_state": "function",
        "train_start_time": "function",
        "wrap_in_process": "function",
    }
    assert seen["dir"] == sorted(rtj_trainer.__all__)


def test_job_settings_are_a_read_only_view_of_the_environment_contract() -> None:
    settings = rtj_trainer.JobSettings.from_environ(
        {"RTJ_CHECKPOINT_INTERVAL_STEPS": "7", "RTJ_LAUNCH_MODE": "supervisor", "RTJ_STORE_HOST": "store"}
        | {"RTJ_ACTIVE_WORLD_SIZE": "4"}
    )
    seen = (settings.checkpoint_interval_steps, settings.supervisor_mode, settings.active_world_size)
    assert seen == (7, True, 4)
    defaults = rtj_trainer.JobSettings.from_environ({})
    assert (defaults.checkpoint_mode, defaults.supervisor_mode, defaults.active_world_size) == (
        "Async",
        False,
        0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.checkpoint_keep = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="RTJ_ACTIVE_WORLD_SIZE"):
        rtj_trainer.JobSettings.from_environ({"RTJ_ACTIVE_WORLD_SIZE": "four"})


def test_wrap_in_process_passes_the_call_wrapper_and_drops_what_the_release_does_not_take() -> None:
    """Disabled (``enabled=False``, as RTJ_INPROCESS_ENABLED=false makes rtj-train's), the function runs
    once with ``call_wrapper=None``; a keyword no NVRx release has is dropped instead of failing."""
    calls: list[object] = []

    def train(call_wrapper: object) -> int:
        calls.append(call_wrapper)
        return 7

    run = rtj_trainer.wrap_in_process(train, enabled=False, no_such_knob_in_any_release=1)
    assert run() == 7
    assert calls == [None]


def test_node_faults_count_what_blames_the_node_for_the_session_s_reports(tmp_path: Path) -> None:
    faults = rtj_trainer.NodeFaults(tmp_path, "node-a")
    assert faults.note(RuntimeError("CUDA out of memory")) is None  # the program's, not the node's
    reason = faults.note(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    assert reason is not None and "ECC" in reason
    assert faults.check_gpus(0, wanted=1) is None  # no CUDA here: nothing to check
    summary = rtj_trainer.NodeFaults(tmp_path, "node-a").summary()  # another rank of the node
    assert summary is not None and (summary["node"], summary["count"]) == ("node-a", 1)
    assert rtj_trainer.NodeFaults(tmp_path).node  # without a name: the host's


def test_the_version_is_the_progress_contracts() -> None:
    assert rtj_trainer.__version__ == rtj_trainer.LIBRARY_VERSION
    assert rtj_trainer.__version__ == progress.LIBRARY_VERSION
    with pytest.raises(AttributeError):
        _ = rtj_trainer.NoSuchName


def test_a_deprecated_name_warns_and_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rtj_trainer._DEPRECATED, "TrainingSession", ("Session", "0.3.0"))
    with pytest.warns(DeprecationWarning, match=r"goes in 0\.3\.0: use rtj_trainer\.Session"):
        old = rtj_trainer.TrainingSession
    assert old is rtj_trainer.Session


def test_heartbeats_do_nothing_outside_ft_launcher_and_go_to_nvrx_s_rank_monitor_under_it(
    tmp_path: Path,
) -> None:
    # In a process of its own: NVRx's client module opens a file at import that it never closes.
    socket = tmp_path / "rank-monitor.socket"  # ft_launcher gives each rank one; no monitor behind this
    result = subprocess.run(
        [sys.executable, "-c", HEARTBEATS_PROGRAM, str(socket)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_clean_environ(), "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    outside, under = result.stdout.splitlines()
    assert outside == "enabled=False connect=ok"
    assert under == "enabled=True connect=RuntimeError"


def test_steps_reach_the_endpoint_file_from_local_rank_0(pod: Path) -> None:
    with rtj_trainer.Session() as session:
        session.step(1, loss=2.5, samples=8, tokens=256)
        first = _report(pod)
        session.checkpoint_saved(1, blocking_seconds=0.25)
        saved = _report(pod)
        session.step(2, loss=1.25)
    final = _report(pod)
    assert (first["step"], first["loss"], first["nodeRank"], first["finished"]) == (1, 2.5, 1, False)
    assert first["lastCheckpoint"] is None and first["restarts"] == {"inProcess": 0, "inJob": 0}
    assert {"usefulStepSeconds", "stepTimeSeconds", "trainStartTime"} <= first.keys()
    assert saved["lastCheckpoint"]["step"] == 1 and saved["checkpointBlockingSeconds"] == 0.25
    assert (final["step"], final["loss"], final["finished"]) == (2, 1.25, True)
    assert first["library"] == final["library"] == rtj_trainer.__version__
    # The totals of the samples and tokens reported so far, and a rate over the step time.
    assert (first["samples"], first["tokens"]) == (8, 256)
    assert first["tokensPerSecond"] == pytest.approx(32 * first["samplesPerSecond"], rel=1e-3)
    assert (final["samples"], final["tokens"]) == (8, 256)  # step 2 reported none: nothing added


def test_samples_and_tokens_are_reported_only_once_given_and_bad_ones_are_refused(pod: Path) -> None:
    with rtj_trainer.Session() as session:
        session.step(1, loss=1.0)
        unreported = _report(pod)
        with pytest.raises(ValueError, match="samples must be >= 0, got -1"):
            session.step(2, samples=-1, tokens=10)
        with pytest.raises(TypeError, match=r"tokens must be a whole number \(an int\), got 2.5"):
            session.step(2, samples=3, tokens=2.5)
        with pytest.raises(TypeError, match="samples must be a whole number"):
            session.step(2, samples=True)
        session.step(2, tokens=100)
    final = _report(pod)
    assert not {"samples", "tokens", "samplesPerSecond", "tokensPerSecond"} & unreported.keys()
    # The refused steps counted nothing; samples were never given, so they are not reported.
    assert final["tokens"] == 100 and "tokensPerSecond" in final
    assert "samples" not in final and "samplesPerSecond" not in final


def test_other_local_ranks_do_not_report(pod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    with rtj_trainer.Session() as session:
        session.step(1, loss=1.0)
        session.checkpoint_saved(1)
    assert not (pod / "progress.json").exists()


def test_a_restarted_process_continues_the_nodes_counters(pod: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError), rtj_trainer.Session() as session:
        session.step(5, loss=1.0, samples=40, tokens=400)
        raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
    crashed = _report(pod)
    assert crashed["finished"] is False and crashed["nodeFaults"]["count"] == 1
    # ft_launcher's next generation of this node: the script resumes from its own checkpoint of step 4.
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with rtj_trainer.Session() as session:
        session.step(5, loss=0.9, samples=8, tokens=80)
        resumed = _report(pod)
    assert resumed["restarts"] == {"inProcess": 0, "inJob": 1}
    event = resumed["events"][-1]
    assert (event["kind"], event["step"], event["stepsLost"], event["resumedFrom"]) == (
        "InJobRestart",
        4,
        1,
        "checkpoint",
    )
    assert resumed["usefulStepSeconds"] >= crashed["usefulStepSeconds"]
    # Without a load() from the library's checkpoint, the node's counts go on (as the useful time does).
    assert (resumed["samples"], resumed["tokens"]) == (48, 480)


@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_an_exception_that_ends_the_block_carries_the_step_it_failed_after(
    pod: Path, monkeypatch: pytest.MonkeyPatch, local_rank: str
) -> None:
    # Every local rank notes it (the failing rank need not be the reporting one), once.
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    with pytest.raises(ValueError, match="bad batch") as raised, rtj_trainer.Session() as session:
        session.step(1)
        session.step(2)
        try:
            raise ValueError("bad batch")
        except ValueError as error:
            error.add_note("a note of the script's own")
            raise
    assert raised.value.__notes__ == ["a note of the script's own", "rtj_trainer: failed after step 2"]
    # An exit is not a failure of the training: no note.
    with pytest.raises(SystemExit) as exited, rtj_trainer.Session():
        raise SystemExit(3)
    assert not hasattr(exited.value, "__notes__")


def test_a_non_finite_loss_is_never_counted_and_ends_the_block(pod: Path) -> None:
    import torch

    for bad in (float("nan"), float("inf"), torch.tensor(float("-inf"))):
        with pytest.raises(rtj_trainer.NonFiniteLossError) as raised, rtj_trainer.Session() as session:
            session.step(1, loss=0.5)
            session.step(2, loss=bad)
        assert str(raised.value).startswith("the loss of step 2 is ")
        assert raised.value.__notes__ == ["rtj_trainer: failed after step 1"]
        assert _report(pod)["step"] == 1 and _report(pod)["loss"] == 0.5
    # A script that skips such steps itself says so; the loss is reported as it is.
    with rtj_trainer.Session(allow_non_finite_loss=True) as session:
        session.step(1, loss=float("nan"))
    assert _report(pod)["step"] == 1


def test_a_failure_before_the_first_step_after_a_restore_is_after_the_restored_step(pod: Path) -> None:
    with rtj_trainer.Session() as session:
        session.step(4)
        session.save(4, {"w": 1})
    with pytest.raises(KeyError) as raised, rtj_trainer.Session() as session:
        assert session.load()[0] == 4
        raise KeyError("labels")
    assert raised.value.__notes__ == ["rtj_trainer: failed after step 4"]


def test_fault_names_the_reason_the_failure_policy_matches(pod: Path) -> None:
    rtj_trainer.Session().fault("DataCorruption", "shard 3 of step 200\nunreadable")
    message = (pod / "termination-log").read_text()
    assert message == "FaultReason: DataCorruption\nshard 3 of step 200 unreadable"
    container = {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": message}}}
    assert container_fault(container) == (1, "DataCorruption")
    with pytest.raises(ValueError, match="one word"):
        rtj_trainer.Session().fault("data corruption")


def test_outside_a_pod_it_does_nothing_and_says_what_is_missing(
    no_pod: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    session = rtj_trainer.Session()
    with pytest.raises(RuntimeError, match="inside `with session:`"):
        session.step(1)
    with caplog.at_level(logging.WARNING, logger="rtj_trainer.session"), session:
        assert signal.getsignal(signal.SIGTERM) == handler
        session.step(1, loss=1.0)
        session.save(1, {"weights": [1.0, 2.0]})
        assert session.load() == (0, None)
        assert not session.draining
        session.checkpoint_saved(1)
        session.fault("DataCorruption")
        with pytest.raises(RuntimeError, match="for a drain"):
            session.drain(1)
    said = caplog.text
    for name in ("RTJ_PROGRESS_FILE", "RTJ_CHECKPOINT_DIR", "RTJ_DRAIN_FILE", "RTJ_TERMINATION_MESSAGE_PATH"):
        assert name in said
    assert list(no_pod.iterdir()) == [], "nothing is written outside a pod"


def test_a_session_runs_one_block(no_pod: Path) -> None:
    session = rtj_trainer.Session()
    with session:
        pass
    with pytest.raises(RuntimeError, match="one block"), session:
        pass


@pytest.mark.parametrize("drained", [True, False])
def test_sigterm_drains_only_with_the_drain_file_else_the_scripts_handler_runs(
    tmp_path: Path, drained: bool
) -> None:
    marker = tmp_path / "drain"
    if drained:
        marker.touch()  # rtj-launch marks the drain before it forwards SIGTERM
    result = subprocess.run(
        [sys.executable, "-c", DRAIN_PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **_clean_environ(),
            "PYTHONPATH": os.pathsep.join(sys.path),
            "RTJ_PROGRESS_FILE": str(tmp_path / "progress.json"),
            "RTJ_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            "RTJ_DRAIN_FILE": str(marker),
        },
        check=False,
    )
    report = _report(tmp_path)
    if drained:
        assert result.returncode == drain.DRAINED_EXIT_CODE, result.stderr
        assert result.stdout.splitlines() == [
            "draining=True handler=[]",
            "rtj-drain: rank=0 step=5 committed=True",
        ]
        assert drain.step_file(marker).read_text() == "5"
        assert (report["step"], report["lastCheckpoint"]["step"], report["finished"]) == (5, 5, False)
    else:
        # ft_launcher stopping its workers (no drain file): what the script asked for happens.
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [
            f"draining=False handler=[{int(signal.SIGTERM)}]",
            "left the block",
        ]
        assert report["finished"] is True
