"""A drain: SIGTERM to one "node" in the middle of training commits a checkpoint at that step on every
rank before the node exits, and the node's replacement resumes from it without losing a step.

Two ft_launcher "nodes" x 2 processes on loopback, as two worker pods (trainer_launch_support). The
SIGTERM goes to the node's whole process group, as the local cluster's kubelet sends it; the chain
rtj-launch -> ft_launcher -> workers is the one a pod runs (rtj_trainer.library.drain).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rtj_trainer.library import checkpoint, drain
from trainer_launch_support import kill_nodes, launch_env, read_progress, start_node

pytestmark = pytest.mark.slow

RESUME = re.compile(r"rank (\d+): iteration \d+ resumes at step (\d+) from (\w+)")
STEPS = 60


def _wait_for_step(workdir: Path, step: int, procs: list[subprocess.Popen[bytes]], timeout: float) -> int:
    """The newest step both nodes reported once it is at least ``step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reports = read_progress(workdir)
        steps = [max((r["step"] for r in reports if r["nodeRank"] == n), default=0) for n in (0, 1)]
        if min(steps) >= step:
            return min(steps)
        assert all(p.poll() is None for p in procs), "a node exited before the drain"
        time.sleep(0.2)
    raise AssertionError(f"training did not reach step {step} within {timeout:.0f} s")


def test_sigterm_commits_a_checkpoint_at_its_step_and_the_replacement_resumes_from_it(
    tmp_path: Path,
) -> None:
    # No periodic checkpoint before the end: the only one in the middle is the drain's.
    base = launch_env(
        tmp_path,
        interval=1000,
        heartbeat_timeout=30,
        extra_env={"RTJ_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log")},
    )
    train_args = ("--step-sleep", "0.15")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in (0, 1):
            procs.append(start_node(tmp_path, base, node, steps=STEPS, train_args=train_args)[0])
        _wait_for_step(tmp_path, 8, procs, timeout=300)
        os.killpg(procs[1].pid, signal.SIGTERM)
        drained_rc = procs[1].wait(timeout=120)
        drained_log = (tmp_path / "node1.log").read_text(errors="replace")
        assert drained_rc == drain.DRAINED_EXIT_CODE, drained_log[-4000:]

        # The checkpoint of the drain's step is complete on disk when the node has exited.
        complete = checkpoint.newest_complete(tmp_path / "checkpoints", 4)
        assert complete is not None and 0 < complete.step < STEPS, drained_log[-4000:]
        drain_step = complete.step
        assert f"rtj-drain: rank=2 step={drain_step} committed=True" in drained_log
        message = (tmp_path / "termination-log").read_text()
        assert message.startswith("Drained:") and f"step {drain_step} committed" in message

        # The replacement node joins; node 0's workers, stopped after the drain, restart with it.
        procs.append(start_node(tmp_path, base, 1, steps=STEPS, train_args=train_args, name="node1b")[0])
        for proc in (procs[0], procs[2]):
            proc.wait(timeout=300)
    finally:
        kill_nodes(procs)
    logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in ("node0", "node1b")]
    assert [procs[0].returncode, procs[2].returncode] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    resumes = {(int(r), int(s), src) for r, s, src in RESUME.findall(logs[0] + logs[1])}
    for rank in range(4):
        assert (rank, drain_step, "checkpoint") in resumes, resumes
    for node in (0, 1):
        final = [r for r in read_progress(tmp_path) if r["nodeRank"] == node][-1]
        assert final["finished"] is True and final["step"] == STEPS
        recovery = final["events"][-1]
        assert (recovery["step"], recovery["resumedFrom"], recovery["stepsLost"]) == (
            drain_step,
            "checkpoint",
            0,
        ), final["events"]
