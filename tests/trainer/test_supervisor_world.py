"""Supervisor mode end to end on loopback: the store pod, two worker pods and two hot spare pods
(each ``rtj-launch`` with two gloo ranks, real torch and NVRx), one fault of each class, worker 0's
"node" lost included. Every fault is recovered in-process by the surviving processes (no process
of a surviving rank restarts), each from memory: no step is lost. A pod started after the world
formed stands by."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rtj_localcluster.marks import signal_matching
from rtj_localcluster.ports import reserve_port_pair

BIN = Path(sys.executable).parent
NODE_MARK = "RTJ_TEST_WORLD_NODE"
STEPS = 90
NPROC = 2


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Each pod's TMPDIR under a short path: the async writer's Unix sockets live there (at most
    108 bytes), and pytest's own temporary paths are long."""
    path = Path(tempfile.mkdtemp(prefix="rtj-w", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _pod_env(tmp: Path, port: int, slot: int, slots: int, faults: str, scratch_root: Path) -> dict[str, str]:
    scratch = Path(tempfile.mkdtemp(prefix=f"{slot}-", dir=scratch_root))
    return {
        **os.environ,
        NODE_MARK: _node_mark(tmp, slot),
        "TMPDIR": str(scratch),
        "RTJ_LAUNCH_MODE": "supervisor",
        "RTJ_ROLE": "worker" if slot < 2 else "spare",
        "RTJ_SLOT": str(slot),
        "RTJ_NODE_RANK": str(slot),
        "RTJ_SLOTS": str(slots),
        "RTJ_NNODES": "2",
        "RTJ_NPROC_PER_NODE": str(NPROC),
        "RTJ_STORE_HOST": "127.0.0.1",
        "RTJ_STORE_PORT": str(port),
        "RTJ_PROGRESS_PORT": "0",
        "RTJ_PROGRESS_SINK": f"file:{tmp / 'progress.jsonl'}",
        "RTJ_PROGRESS_INTERVAL_SECONDS": "0.5",
        "RTJ_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "RTJ_CHECKPOINT_INTERVAL_STEPS": "20",
        "RTJ_MEMORY_INTERVAL_STEPS": "1",
        "RTJ_INPROCESS_SOFT_TIMEOUT_SECONDS": "4",
        "RTJ_INPROCESS_HARD_TIMEOUT_SECONDS": "8",
        "RTJ_INPROCESS_BARRIER_TIMEOUT_SECONDS": "20",
        "RTJ_FAULTS": faults,
    }


def _progress(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "progress.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _max_step(tmp: Path) -> int:
    return max((int(r["step"]) for r in _progress(tmp)), default=-1)


@contextlib.contextmanager
def _store(port: int, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    with (tmp / "store.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rtj_trainer.runtime.store", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def _start_pod(tmp: Path, env: dict[str, str], slot: int) -> subprocess.Popen[bytes]:
    with (tmp / f"pod-{slot}.log").open("ab") as log:
        return subprocess.Popen(
            [str(BIN / "rtj-launch"), "--", "rtj-train", "--steps", str(STEPS), "--step-sleep", "0.1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _node_mark(tmp: Path, slot: int) -> str:
    """The "node"'s mark: the test's own folder with the slot, so that parallel test workers' worlds
    never match each other's."""
    return f"{tmp}:{slot}"


def _kill_node(tmp: Path, slot: int) -> int:
    """Every process of the "node": rtj-launch, its ranks, their NVRx monitor processes, writers."""
    mark = _node_mark(tmp, slot)
    return signal_matching(signal.SIGKILL, lambda env: env.get(NODE_MARK) == mark)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _events(tmp: Path) -> list[dict[str, Any]]:
    """Each pod's recovery events, once each (every report repeats the recent ones)."""
    seen: dict[tuple[int, str, float], dict[str, Any]] = {}
    for report in _progress(tmp):
        for event in report.get("events", []):
            seen[(report["nodeRank"], event["kind"], round(float(event["faultEpoch"]), 3))] = event
    return sorted(seen.values(), key=lambda e: float(e["faultEpoch"]))


@pytest.mark.slow
@pytest.mark.image_nvrx_only  # on 0.4.1: the quick demo's test (tests/demo), on the local cluster
def test_every_fault_class_is_recovered_in_process_from_memory(tmp_path: Path, short_tmp: Path) -> None:
    faults = "exception@step=10,rank=1;sigkill@step=25,rank=2;hang@step=40,rank=3"
    port = reserve_port_pair()
    slots = 4
    pods: dict[int, subprocess.Popen[bytes]] = {}
    standby: subprocess.Popen[bytes] | None = None
    with _store(port, tmp_path):
        try:
            for slot in range(slots):
                pods[slot] = _start_pod(
                    tmp_path, _pod_env(tmp_path, port, slot, slots, faults, short_tmp), slot
                )
            # Worker 0's node, lost once the hang is recovered: its ranks and the store's host rank
            # under ft_launcher; here an ordinary loss.
            _wait(lambda: _max_step(tmp_path) >= 60, 400, "step 60")
            step_at_loss = _max_step(tmp_path)
            killed = _kill_node(tmp_path, 0)
            assert killed >= 1 + 2 * NPROC  # rtj-launch, the ranks and their monitor processes
            lost_at = time.time()
            _wait(lambda: _max_step(tmp_path) > step_at_loss + 1, 120, "training after the loss")
            print(
                f"worker 0's node lost at step {step_at_loss}:"
                f" training again {time.time() - lost_at:.1f} s later"
            )
            # The replacement pod of worker 0 starts after the world formed: it stands by.
            standby = _start_pod(tmp_path, _pod_env(tmp_path, port, 0, slots, faults, short_tmp), 0)
            for slot in (1, 2, 3):
                assert pods[slot].wait(400) == 0, (tmp_path / f"pod-{slot}.log").read_text()[-3000:]
            # Once the world finished, the standby pod ends with success too: the operator counts
            # a job done when every worker pod is.
            assert standby.wait(30) == 0
        finally:
            for slot in range(slots):
                _kill_node(tmp_path, slot)
            for pod in [*pods.values(), *([standby] if standby is not None else [])]:
                pod.wait(30)
    log0 = (tmp_path / "pod-0.log").read_text()
    assert "standing by" in log0 and "this pod's part is done" in log0
    events = _events(tmp_path)
    by_step: dict[int, set[str]] = {}
    for event in events:
        by_step.setdefault(int(event["step"]), set()).add(event["resumedFrom"])
    assert all(e["kind"] == "InProcessRestart" and e["stepsLost"] == 0 for e in events), events
    # The exception and the hang: every rank from its own memory. The SIGKILL and the lost node:
    # the reserve ranks that took the lost indices from their replicas (the survivors from memory).
    assert by_step[10] == {"memory"} and by_step[40] == {"memory"}, by_step
    assert by_step[25] == {"memory", "memory-replica"}, by_step
    after_loss = {e["resumedFrom"] for e in events if float(e["recoveredEpoch"]) > lost_at}
    assert after_loss == {"memory", "memory-replica"}, events
    final = [r for r in _progress(tmp_path) if r.get("finished")]
    assert final and all(r["step"] == STEPS for r in final)
    logs = "".join((tmp_path / f"pod-{slot}.log").read_text() for slot in range(slots))
    # Reserve ranks took the killed rank's index and worker 0's two indices.
    assert logs.count("takes the index of lost rank") == 3
