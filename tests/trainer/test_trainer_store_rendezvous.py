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

import datetime as dt
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from rtj_contract import env as env_names
from rtj_operator import events
from rtj_operator.observe import container_fault
from rtj_trainer.library import checkpoint, nvrx_compat
from rtj_trainer.runtime import store
from trainer_launch_support import BIN, kill_nodes, launch_env, lose_node, read_progress, start_node

pytestmark = pytest.mark.slow

STEPS = 60
# One process per node there, so each step is cheaper: enough steps to outlast a loss and a round.
STANDBY_STEPS = 150


def _wait_for_a_checkpoint(
    workdir: Path, procs: list[subprocess.Popen[bytes]], timeout: float, world_size: int = 4
) -> int:
    """The step of the first checkpoint every rank committed, once both nodes trained past it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        complete = checkpoint.newest_complete(workdir / "checkpoints", world_size)
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
    store_proc = _start_store(tmp_path, base, "--nnodes", "2")
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


def _start_store(workdir: Path, base: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    with open(workdir / "store.log", "wb") as out:
        return subprocess.Popen(
            [str(BIN / "rtj-store"), "--port", base["RTJ_RDZV_PORT"],
             "--rendezvous-id", base["RTJ_JOB_UID"], *args],
            env=base,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _epoch(record: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(record["time"]).timestamp()


def _first_step_after(workdir: Path, node: int, since: float, timeout: float) -> dict[str, Any]:
    """The first progress record of node rank `node` with a step, written after `since` (epoch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in read_progress(workdir):
            if record["nodeRank"] == node and _epoch(record) > since and record["step"] > 0:
                return record
        time.sleep(0.2)
    raise AssertionError(f"node rank {node} trained no step within {timeout:.0f} s of the loss")


@pytest.mark.image_nvrx_only  # standby nodes need 0.7's barrier rendezvous; on 0.4.1 rtj-launch refuses them
def test_a_standby_spare_takes_a_lost_nodes_place_and_the_replacement_stands_by(tmp_path: Path) -> None:
    """rendezvous.spares Standby: nodes 0 and 1 train, the spare's ft_launcher (infrastructure rank 2)
    waits in the store's rendezvous. Node 1 is lost: the next round closes with node 0 and the spare,
    which resumes node 1's ranks from the checkpoint with no new node started; node 1's replacement,
    started afterwards, stands by, and every launcher ends with 0 when the training has finished.

    The spare starts once the first round has closed: NVRx's rendezvous makes active the first nodes
    that join a round, whichever pods they are (on a cluster a spare pod may train and a worker pod
    stand by), and a node that comes later waits for the next round without restarting anyone."""
    base = launch_env(tmp_path, interval=5, heartbeat_timeout=10, nproc=1)
    base.update(
        RTJ_STORE_HOST=base["RTJ_RDZV_HOST"], RTJ_STORE_PORT=base["RTJ_RDZV_PORT"], RTJ_NNODES_MAX="3"
    )
    store_proc = _start_store(tmp_path, base, "--nnodes", "2", "--nnodes-max", "3")
    train_args = ("--step-sleep", "0.15")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in (0, 1):
            procs.append(start_node(tmp_path, base, node, steps=STANDBY_STEPS, train_args=train_args)[0])
        _first_step_after(tmp_path, 1, 0.0, timeout=180)
        spare_env = {**base, "RTJ_ROLE": "spare"}
        spare, _ = start_node(
            tmp_path, spare_env, 2, steps=STANDBY_STEPS, train_args=train_args, name="spare"
        )
        procs.append(spare)
        committed = _wait_for_a_checkpoint(tmp_path, [store_proc, *procs], timeout=300, world_size=2)
        assert not [r for r in read_progress(tmp_path) if r["nodeRank"] == 2], (
            "the spare trained while standing by"
        )
        lost_at = time.time()
        lose_node(procs[1])
        resumed = _first_step_after(tmp_path, 2, lost_at, timeout=120)
        replacement, _ = start_node(
            tmp_path, base, 1, steps=STANDBY_STEPS, train_args=train_args, name="node1b", address="127.0.0.9"
        )
        procs.append(replacement)
        for proc in (procs[0], spare, replacement):
            proc.wait(timeout=300)
        assert store_proc.poll() is None, "the store left with node 1"
    finally:
        kill_nodes([*procs, store_proc])
    logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in ("node0", "spare", "node1b")}
    detail = (
        "".join(log[-3000:] for log in logs.values())
        + (tmp_path / "store.log").read_text(errors="replace")[-2000:]
    )
    assert [procs[0].returncode, spare.returncode, replacement.returncode] == [0, 0, 0], detail
    print(f"the spare's first step came {_epoch(resumed) - lost_at:.1f} s after node 1 was lost")
    # The spare took node 1's place (its records carry its own infrastructure rank, 2) from a
    # checkpoint no older than the one committed before the loss, and finished the training.
    spare_records = [r for r in read_progress(tmp_path) if r["nodeRank"] == 2]
    assert spare_records[-1]["finished"] is True and spare_records[-1]["step"] == STANDBY_STEPS, (
        spare_records[-1]
    )
    assert resumed["step"] > committed >= 0
    final = [r for r in read_progress(tmp_path) if r["nodeRank"] == 0][-1]
    assert final["finished"] is True and final["step"] == STANDBY_STEPS, final
    # The replacement never trained: the round it came to had its active nodes.
    assert not [r for r in read_progress(tmp_path) if r["nodeRank"] == 1 and _epoch(r) > lost_at]


def test_rtj_store_runs_nvrx_control_only_where_the_rendezvous_needs_it() -> None:
    assert store.rendezvous_command(29500, run_id="u", nnodes=4, version=(0, 4, 1)) is None
    try:
        command = store.rendezvous_command(29500, run_id="u", nnodes=4, version=(0, 7, 0), python="py")
    except store.RendezvousHostError as err:  # this interpreter has 0.4.1 on its path
        assert "needs NVRx 0.7 or later" in str(err) and "rendezvous.host Worker0" in str(err)
        return
    assert command[:3] == ["py", "-m", store.NVRX_CONTROL_MODULE]
    assert {"--nnodes=4:4", "--rdzv-endpoint=127.0.0.1:29500", "--rdzv-id=u"} <= set(command)
    standby = store.rendezvous_command(
        29500, run_id="u", nnodes=4, nnodes_max=6, version=(0, 7, 0), python="py"
    )
    assert standby is not None and "--nnodes=4:6" in standby


def test_rtj_store_that_cannot_host_the_rendezvous_tells_the_operator_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A barrier release without NVRx's control node (0.5, 0.6): the pod ends with the verdict the
    # operator fails the job on, naming the way out, instead of a bare exit the gang restarts after.
    monkeypatch.setattr(nvrx_compat, "nvrx_version", lambda: (0, 6, 0))
    monkeypatch.setattr(store.importlib.util, "find_spec", lambda name, package=None: None)
    message = tmp_path / "termination-log"
    monkeypatch.setenv(env_names.TERMINATION_MESSAGE_PATH, str(message))
    code = store.main(["--port", "29500", "--rendezvous-id", "u", "--nnodes", "2"])
    terminated = {"exitCode": code, "reason": "Error", "message": message.read_text()}
    assert container_fault({"name": "store", "state": {"terminated": terminated}}) == (
        78,
        events.STARTUP_FAILED,
    )
    assert "rendezvous.host Worker0" in terminated["message"]
