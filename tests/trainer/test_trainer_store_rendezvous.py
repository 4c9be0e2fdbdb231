"""rendezvous.host StorePod: ft_launcher's rendezvous lives in the store pod (``rtj-store
--rendezvous-id``), so losing node 0, whose launcher would otherwise host it, is an ordinary node loss.

Two ft_launcher "nodes" x 2 processes on loopback (trainer_launch_support) beside a store process, as
two worker pods and the store pod: node 0's whole process group is killed (its node is lost), the
survivor's launcher stays up, and a replacement node joins the next round of the rendezvous; the
job ends on both nodes with every step trained. On NVRx 0.7.0 (the image's release) the store pod
runs NVRx's own control node (nvrx-control), which closes the barrier rendezvous' rounds; 0.4.1's
plain c10d store runs the same way in the local cluster's demo test (tests/demo).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from rtj_trainer.library import checkpoint
from rtj_trainer.runtime import store
from trainer_launch_support import BIN, kill_nodes, launch_env, lose_node, read_progress, start_node

pytestmark = pytest.mark.slow

STEPS = 60


def _wait_for_a_checkpoint(workdir: Path, procs: list[subprocess.Popen[bytes]], timeout: float) -> int:
    """The step of the first checkpoint every rank committed, once both nodes trained past it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        complete = checkpoint.newest_complete(workdir / "checkpoints", 4)
        reports = read_progress(workdir)
        steps = [max((r["step"] for r in reports if r["nodeRank"] == n), default=0) for n in (0, 1)]
        if complete is not None and min(steps) > complete.step:
            return complete.step
        assert all(p.poll() is None for p in procs), "a process exited before node 0 was lost"
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint was committed within {timeout:.0f} s")


@pytest.mark.image_nvrx_only  # on 0.4.1: the FtLauncher store-pod demo's test, on the local cluster
def test_losing_node_zero_leaves_the_rendezvous_in_the_store_pod_and_a_replacement_joins(
    tmp_path: Path,
) -> None:
    base = launch_env(tmp_path, interval=5, heartbeat_timeout=10)
    base["RTJ_STORE_HOST"], base["RTJ_STORE_PORT"] = base["RTJ_RDZV_HOST"], base["RTJ_RDZV_PORT"]
    store_log = tmp_path / "store.log"
    with open(store_log, "wb") as out:
        store_proc = subprocess.Popen(
            [str(BIN / "rtj-store"), "--port", base["RTJ_RDZV_PORT"], "--rendezvous-id", base["RTJ_JOB_UID"],
             "--nnodes", "2"],
            env=base,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    train_args = ("--step-sleep", "0.15")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in (0, 1):
            procs.append(start_node(tmp_path, base, node, steps=STEPS, train_args=train_args)[0])
        committed = _wait_for_a_checkpoint(tmp_path, [store_proc, *procs], timeout=300)
        lose_node(procs[0])  # node 0's node is lost, its launcher with it
        replacement, _ = start_node(
            tmp_path, base, 0, steps=STEPS, train_args=train_args, name="node0b", address="127.0.0.9"
        )
        procs.append(replacement)
        for proc in (procs[1], replacement):
            proc.wait(timeout=300)
        assert store_proc.poll() is None, "the store left with node 0"
    finally:
        kill_nodes([*procs, store_proc])
    logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in ("node1", "node0b")}
    detail = "".join(log[-3000:] for log in logs.values()) + store_log.read_text(errors="replace")[-2000:]
    # The survivor's launcher outlived node 0 (had node 0 hosted the rendezvous, it would have gone).
    assert [procs[1].returncode, replacement.returncode] == [0, 0], detail
    for node in (0, 1):
        final = [r for r in read_progress(tmp_path) if r["nodeRank"] == node][-1]
        assert final["finished"] is True and final["step"] == STEPS, final
    # The survivor's ranks restarted with the replacement's, from a checkpoint no older than the one
    # committed before the loss.
    recovery = [r for r in read_progress(tmp_path) if r["nodeRank"] == 1][-1]["events"][-1]
    assert recovery["resumedFrom"] == "checkpoint" and recovery["step"] >= committed, recovery


def test_rtj_store_runs_nvrx_control_only_where_the_rendezvous_needs_it() -> None:
    assert store.rendezvous_command(29500, run_id="u", nnodes=4, version=(0, 4, 1)) is None
    try:
        command = store.rendezvous_command(29500, run_id="u", nnodes=4, version=(0, 7, 0), python="py")
    except store.RendezvousHostError as err:  # this interpreter has 0.4.1 on its path
        assert "needs NVRx 0.7 or later" in str(err) and "rendezvous.host Worker0" in str(err)
        return
    assert command[:3] == ["py", "-m", store.NVRX_CONTROL_MODULE]
    assert {"--nnodes=4:4", "--rdzv-endpoint=127.0.0.1:29500", "--rdzv-id=u"} <= set(command)
