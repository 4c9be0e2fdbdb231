"""The building blocks of a Session, public since library 0.3.0 (docs/library.md, "Building blocks"),
used through the facade as a script of one's own uses them: a rank's checkpoints saved, skipped,
committed and loaded (real torch tensors on the CPU, a real writer process for async saves), a
drain requested by the pod's SIGTERM, and the node's report sent by the pod's reporting rank (local
rank 0, or under the Supervisor launcher the holder of the pod's reporting lock, which passes on
when its process ends)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rtj_trainer
import torch
import torch.distributed as dist
from rtj_localcluster.ports import reserve_port

CPU = torch.device("cpu")


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(64, 32, generator=generator), "bias": torch.randn(32, generator=generator)}


def _manager(root: Path, *, asynchronous: bool) -> rtj_trainer.CheckpointManager:
    return rtj_trainer.CheckpointManager(
        root, rank=0, world_size=1, asynchronous=asynchronous, keep=2, stage_in_background=asynchronous
    )


def test_a_sync_checkpoint_commits_loads_back_and_a_skipped_save_point_writes_nothing(tmp_path: Path) -> None:
    manager = _manager(tmp_path, asynchronous=False)
    state = _state(seed=1)
    try:
        assert manager.ready_to_write_everywhere(CPU)  # no process group: this rank's answer
        manager.save(10, state, {"loss": 0.5})
        assert manager.wait_committed(10, timeout=60)
        manager.poll()
        manager.save(20, state, {"loss": 0.4}, write=False)  # a writer somewhere is still busy
        assert (manager.stats.saves, manager.stats.skipped) == (1, 1)
        assert manager.newest_step() == 10
        assert manager.last_committed is not None and manager.last_committed.step == 10
        info, payload = manager.load(10)
    finally:
        manager.close()
    assert info.step == 10 and info.world_size == 1
    assert payload["extra"] == {"loss": 0.5}
    assert all(torch.equal(payload["tensors"][name], tensor) for name, tensor in state.items())


def test_an_async_save_keeps_the_state_of_its_step_while_the_next_one_changes_it(tmp_path: Path) -> None:
    manager = _manager(tmp_path, asynchronous=True)
    state = _state(seed=2)
    saved = {name: tensor.clone() for name, tensor in state.items()}
    try:
        manager.start_writer()
        manager.save(5, state, {"loss": 1.0})
        manager.wait_staged()  # before the optimizer step changes the tensors in place
        for tensor in state.values():
            tensor.mul_(-2.0)
        assert manager.wait(timeout=300)
        assert manager.wait_committed(5, timeout=120)
        _, payload = manager.load(5)
    finally:
        manager.close()
    assert all(torch.equal(payload["tensors"][name], tensor) for name, tensor in saved.items())


def test_resuming_discards_the_partial_saves_newer_than_the_step_resumed_from(tmp_path: Path) -> None:
    manager = _manager(tmp_path, asynchronous=False)
    try:
        manager.save(1, _state(seed=3), {})
        assert manager.wait_committed(1, timeout=60)
        partial = tmp_path / "step-000000002"
        partial.mkdir()  # a save the failed attempt did not finish
        (partial / "rank-00000.done").write_text("{}")
        assert manager.newest_step() == 1
        assert manager.discard_partials_after(1) == [partial]
    finally:
        manager.close()
    assert not partial.exists()


DRAIN_PROGRAM = """
import os, signal, sys
from pathlib import Path
import torch
import rtj_trainer
request = rtj_trainer.install_drain_handler(Path(sys.argv[1]))
os.kill(os.getpid(), signal.SIGTERM)
agreed = request.agreed(torch.device("cpu"))  # a single rank: its own request
request.record_committed_step(40)
print(f"requested={request.requested} agreed={agreed} exit_code={request.exit_code}", flush=True)
"""


def _run_drain_program(marker: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRAIN_PROGRAM, str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


def test_sigterm_with_the_drain_file_requests_a_drain_and_any_other_ends_the_process(tmp_path: Path) -> None:
    marker = tmp_path / "drain"
    marker.touch()  # rtj-launch marks the drain before it forwards the pod's SIGTERM
    drained = _run_drain_program(marker)
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.strip() == "requested=True agreed=True exit_code=143"
    assert (tmp_path / "drain.step").read_text() == "40"  # rtj-launch's termination message reads it
    marker.unlink()
    stopped = _run_drain_program(marker)  # ft_launcher stopping its workers: no drain file
    assert stopped.returncode == -signal.SIGTERM and stopped.stdout == ""


def _agreeing_on_drains(rank: int, ports: list[int], out: str) -> None:
    """One rank of two calling `agreed` once a step; rank 1's pod asks to drain before call 2, and
    the process group is made anew after call 4, as an in-process restart does."""
    request = rtj_trainer.DrainRequest(None)
    answers: list[bool] = []
    for group in range(2):
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{ports[group]}", rank=rank, world_size=2
        )
        for call in range(5 if group == 0 else 2):
            if rank == 1 and group == 0 and call == 2:
                request.requested = True  # what the SIGTERM handler sets
            answers.append(request.agreed(CPU))
            time.sleep(0.05)  # the step the all-reduce overlaps
        dist.barrier()
        dist.destroy_process_group()
    Path(out).write_text(json.dumps(answers))


def test_every_rank_learns_of_a_drain_at_the_same_step_one_step_after_it_was_asked(tmp_path: Path) -> None:
    """The agreement's all-reduce runs while the next step computes: the answer comes one call later,
    the same on both ranks; a new process group starts from no answer (the request still stands)."""
    ports = [reserve_port(), reserve_port()]
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    procs = [ctx.Process(target=_agreeing_on_drains, args=(r, ports, str(outs[r]))) for r in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    expected = [False, False, False, True, True, False, True]
    assert [json.loads(out.read_text()) for out in outs] == [expected, expected]


def test_a_drain_request_without_a_drain_file_never_drains() -> None:
    request = rtj_trainer.DrainRequest(None)
    assert (request.requested, request.agreed(CPU), request.exit_code) == (False, False, 75)


def _settings(tmp_path: Path, **extra: str) -> rtj_trainer.JobSettings:
    return rtj_trainer.JobSettings.from_environ(
        {"RTJ_PROGRESS_SINK": f"file:{tmp_path / 'reports.jsonl'}", "RTJ_NODE_RANK": "1", "RTJ_NNODES": "2"}
        | extra
    )


def test_local_rank_0_reports_the_node_s_progress_and_a_restarted_process_finds_it(tmp_path: Path) -> None:
    settings, checkpoints = _settings(tmp_path), tmp_path / "checkpoints"
    start = rtj_trainer.train_start_time(checkpoints, 1_700_000_000.0)
    assert rtj_trainer.train_start_time(checkpoints, 1_800_000_000.0) == start == 1_700_000_000.0
    progress = rtj_trainer.Progress(node_rank=settings.node_rank, train_start_time=start)
    progress.step, progress.loss, progress.restarts_in_process = 12, 0.75, 1
    event = rtj_trainer.RecoveryEvent("InProcessRestart", 10, 1_700_000_100.0, 1_700_000_102.5, 2, "memory")
    progress.add_event(event)
    other = rtj_trainer.Reporter.for_pod(settings, str(checkpoints), local_rank=1)
    assert not other.reports and not other.report(progress, force=True)
    reporter = rtj_trainer.Reporter.for_pod(settings, str(checkpoints), local_rank=0)
    assert reporter.reports and reporter.report(progress, force=True)
    (line,) = (tmp_path / "reports.jsonl").read_text().splitlines()
    report = json.loads(line)
    assert (report["step"], report["loss"], report["restarts"]["inProcess"]) == (12, 0.75, 1)
    assert report["events"] == [event.to_json()] and report["events"][0]["recoverySeconds"] == 2.5
    assert event.log_line().startswith("rtj-recovery: kind=InProcessRestart resumed_step=10 from=memory")
    assert rtj_trainer.load_node_state(checkpoints, 1) == report
    assert rtj_trainer.load_node_state(checkpoints, 0) is None


LOCK_HOLDER_PROGRAM = """
import os, sys
import rtj_trainer
settings = rtj_trainer.JobSettings.from_environ(os.environ)
reporter = rtj_trainer.Reporter.for_pod(settings, sys.argv[1], local_rank=1)
print(f"reports={reporter.reports}", flush=True)
sys.stdin.read()  # holds the lock until the test closes its input
"""


def test_under_the_supervisor_launcher_the_lock_holder_reports_until_its_process_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report_file = tmp_path / "progress.json"  # the pod's: rtj-launch serves it on the progress port
    pod = {"RTJ_LAUNCH_MODE": "supervisor", "RTJ_STORE_HOST": "store", "RTJ_PROGRESS_SINK": "endpoint"}
    pod["RTJ_PROGRESS_FILE"] = str(report_file)
    for name, value in pod.items():
        monkeypatch.setenv(name, value)
    settings = _settings(tmp_path, **pod)
    assert settings.supervisor_mode
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER_PROGRAM, str(tmp_path / "checkpoints")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert holder.stdin is not None and holder.stdout is not None
    with holder.stdin, holder.stdout:
        assert holder.stdout.readline().strip() == "reports=True"
        reporter = rtj_trainer.Reporter.for_pod(settings, str(tmp_path / "checkpoints"), local_rank=0)
        assert not reporter.reports  # local rank 0, but another rank of the pod holds the lock
    holder.wait(timeout=60)
    assert reporter.reports  # the holder's process ended: this rank takes over
    assert reporter.report(rtj_trainer.Progress(node_rank=1, train_start_time=0.0), force=True)
    assert json.loads(report_file.read_text())["nodeRank"] == 1
