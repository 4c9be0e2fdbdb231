"""The library's checkpoints and drains across two ranks (gloo on the CPU, two processes per run, an
FSDP2 model): an async sharded save commits and loads back into a freshly sharded model and its
optimizer (``load(like=...)`` rebuilds the DTensors), a SIGTERM on one rank's pod drains both:
each commits the step after the SIGTERM's (the ranks' agreement is read a step after it starts) and
exits with its drain code, and a byte flipped in one rank's shard of that checkpoint makes both
ranks fall back to the one before it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import rtj_trainer
import torch
from file_faults import flip_a_bit
from rtj_localcluster.ports import reserve_port
from rtj_trainer.library import checkpoint, drain

SCRIPT = r"""
import json, os, signal, sys
from pathlib import Path
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
import rtj_trainer


def local(value):
    if isinstance(value, DTensor):
        return value.to_local().clone()
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: local(v) for k, v in value.items()}
    return value


def main(phase, out):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def train_step(step):
        inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 10 + rank))
        loss = model(inputs).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def state():
        model_state, optim_state = get_state_dict(model, opt)
        return {"model": model_state, "optim": optim_state, "note": ("two", 2)}

    with rtj_trainer.Session() as session:
        if phase == "save":
            for step in (1, 2):
                session.step(step, loss=train_step(step))
            session.save(2, state())
            torch.save(local(state()), out / f"expected-{rank}.pt")
            return
        if phase == "fallback":
            start, restored = session.load(like=state())
            set_state_dict(model, opt, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
            expected = torch.load(out / f"expected-{rank}.pt", weights_only=True)
            same = all(torch.equal(local(state())["model"][k], v) for k, v in expected["model"].items())
            (out / f"fallback-{rank}.json").write_text(json.dumps({"start": start, "same": same}))
            return
        start, restored = session.load(like=state())
        set_state_dict(model, opt, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
        expected = torch.load(out / f"expected-{rank}.pt", weights_only=True)
        now = local(state())
        same = all(torch.equal(now["model"][k], v) for k, v in expected["model"].items()) and all(
            torch.equal(now["optim"]["state"][k][name], value)
            for k, tensors in expected["optim"]["state"].items()
            for name, value in tensors.items()
        )
        dtensors = all(isinstance(v, DTensor) for v in restored["model"].values())
        (out / f"loaded-{rank}.json").write_text(
            json.dumps({"start": start, "same": same, "dtensors": dtensors, "note": list(restored["note"])})
        )
        if rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # the pod's SIGTERM, on this rank's pod only
        session.step(start + 1, loss=train_step(start + 1))
        # The ranks' agreement runs while the next step computes: known one step later, on both.
        assert not session.draining
        session.step(start + 2, loss=train_step(start + 2))
        assert session.draining
        session.drain(start + 2, state())


# The async checkpoint writer is a spawned process, which imports this file: the guard keeps it
# from training too.
if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
"""


def _run_two_ranks(
    script: Path, phase: str, directory: Path, extra_env: dict[str, str], pods: str = "pod"
) -> list[int]:
    port = reserve_port()  # not an ephemeral one: the other test lane's connections take those
    base = {k: v for k, v in os.environ.items() if not k.startswith("RTJ_")}
    procs = []
    for rank in (0, 1):
        # Each rank is local rank 0 of its own pod, as on two nodes; only rank 0's pod drains.
        pod = directory / f"{pods}-{rank}"
        pod.mkdir(exist_ok=True)
        env = {
            **base,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "RTJ_NODE_RANK": str(rank),
            "RTJ_NNODES": "2",
            "RTJ_CHECKPOINT_DIR": str(directory / "checkpoints"),
            "RTJ_PROGRESS_FILE": str(pod / "progress.json"),
            "RTJ_DRAIN_FILE": str(pod / "drain"),
            **extra_env,
        }
        log = open(directory / f"{phase}-{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, str(script), phase, str(directory)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))  # fmt: skip
    try:
        return [proc.wait(timeout=240) for proc, _ in procs]
    finally:
        for proc, log in procs:
            proc.kill()
            proc.wait()
            log.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run 1 (async saves) trains two steps, saves step 2 and ends; run 2 (sync saves) loads it,
    and rank 0's pod is drained after one more step."""
    directory = tmp_path_factory.mktemp("library")
    script = directory / "train.py"
    script.write_text(SCRIPT)
    saved = _run_two_ranks(script, "save", directory, {"RTJ_CHECKPOINT_MODE": "Async"})
    (directory / "pod-0" / "drain").touch()  # rtj-launch marks the drain before it forwards SIGTERM
    drained = _run_two_ranks(script, "resume", directory, {"RTJ_CHECKPOINT_MODE": "Sync"})
    drain_checkpoint = checkpoint.newest_complete(directory / "checkpoints", 2)
    if drain_checkpoint is not None:  # the drain test says why not otherwise
        (directory / "drain-checkpoint.json").write_text(json.dumps({"step": drain_checkpoint.step}))
        flip_a_bit(checkpoint.shard_path(directory / "checkpoints", drain_checkpoint.step, 1))  # rank 1's
    fell_back = _run_two_ranks(script, "fallback", directory, {"RTJ_CHECKPOINT_MODE": "Sync"}, pods="new-pod")
    logs = {p.name: p.read_text() for p in directory.glob("*.log")}
    return {"dir": directory, "saved": saved, "drained": drained, "fell_back": fell_back, "logs": logs}


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_a_sharded_save_commits_and_loads_back_into_a_fresh_fsdp_model(runs: dict[str, Any]) -> None:
    directory: Path = runs["dir"]
    assert runs["saved"] == [0, 0], runs["logs"]
    for rank in (0, 1):
        loaded = _json(directory / f"loaded-{rank}.json")
        assert loaded == {"start": 2, "same": True, "dtensors": True, "note": ["two", 2]}, runs["logs"]
        report = _json(directory / f"pod-{rank}" / "progress.json")
        assert report["lastCheckpoint"]["step"] >= 2


@pytest.mark.slow
def test_a_drain_commits_the_current_step_on_every_rank_and_exits_with_its_code(
    runs: dict[str, Any],
) -> None:
    directory: Path = runs["dir"]
    assert runs["drained"] == [drain.DRAINED_EXIT_CODE, drain.PEER_DRAINED_EXIT_CODE], runs["logs"]
    # The newest checkpoint when the drained run ended (the fallback run set it aside afterwards): the
    # step after the SIGTERM's, when both ranks learned of it.
    assert _json(directory / "drain-checkpoint.json") == {"step": 4}
    # The drained pod's rank tells rtj-launch the committed step (its termination message); the peer not.
    assert drain.step_file(directory / "pod-0" / "drain").read_text() == "4"
    assert not drain.step_file(directory / "pod-1" / "drain").exists()
    report = _json(directory / "pod-0" / "progress.json")
    assert (report["step"], report["lastCheckpoint"]["step"], report["finished"]) == (4, 4, False)
    assert "rtj-drain: rank=0 step=4 committed=True" in runs["logs"]["resume-0.log"]


@pytest.mark.slow
def test_a_flipped_byte_in_one_ranks_shard_makes_every_rank_fall_back_to_the_checkpoint_before(
    runs: dict[str, Any],
) -> None:
    directory: Path = runs["dir"]
    assert runs["fell_back"] == [0, 0], runs["logs"]
    corrupt = _json(directory / "drain-checkpoint.json")["step"]
    for rank in (0, 1):
        # Step 2's state, as saved: the drain's step 4 is not read on either rank.
        assert _json(directory / f"fallback-{rank}.json") == {"start": 2, "same": True}, runs["logs"]
    assert "is corrupt: CRC-32" in runs["logs"]["fallback-1.log"]
    assert "is corrupt" not in runs["logs"]["fallback-0.log"]  # rank 0's shard was intact
    # Set aside by rank 0, not deleted, and no longer a checkpoint.
    assert [p.name.split("-17")[0] for p in (directory / "checkpoints").glob("corrupt-*")] == [
        f"corrupt-step-{corrupt:09d}"
    ]
    assert checkpoint.newest_complete(directory / "checkpoints", 2).step == 2  # type: ignore[union-attr]


def _one_rank_outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """No contract variable, no process group: one rank, synchronous saves."""
    for name in [n for n in os.environ if n.startswith("RTJ_") or n in ("RANK", "WORLD_SIZE", "LOCAL_RANK")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RTJ_CHECKPOINT_MODE", "Sync")


def test_one_rank_round_trip_and_a_state_that_cannot_be_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside a pod, with a checkpoint directory given: checkpoints work, nothing is reported.
    _one_rank_outside_a_pod(monkeypatch)
    state: dict[str, Any] = {
        "w": torch.arange(6.0).reshape(2, 3),
        "groups": [{"lr": 0.1, "betas": (0.9, 0.99)}],
        "by_id": {7: None},
    }
    with rtj_trainer.Session(checkpoint_dir=tmp_path) as session:
        assert session.load() == (0, None)
        with pytest.raises(TypeError, match="groups/0/fn is a object"):
            session.save(1, {"groups": [{"fn": object()}]})
        session.save(4, state)
    with rtj_trainer.Session(checkpoint_dir=tmp_path) as session:
        step, loaded = session.load(like={"w": torch.zeros(2, 3, dtype=torch.float64)})
    assert step == 4 and loaded is not None
    assert (
        torch.equal(loaded["w"], state["w"])
        and loaded["groups"] == state["groups"]
        and loaded["by_id"] == {7: None}
    )
    assert [info.step for info in checkpoint.list_checkpoints(tmp_path)] == [4]


def test_samples_and_tokens_resume_from_the_checkpoint_not_from_the_crashed_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One rank in a pod: the steps after the checkpoint are redone after the crash, not counted twice.
    _one_rank_outside_a_pod(monkeypatch)
    monkeypatch.setenv("RTJ_CHECKPOINT_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("RTJ_PROGRESS_FILE", str(tmp_path / "progress.json"))
    with pytest.raises(RuntimeError, match="crash"), rtj_trainer.Session() as session:
        assert session.load() == (0, None)
        for step in (1, 2, 3):
            session.step(step, samples=8, tokens=64)
            if step == 2:
                session.save(2, {"w": torch.zeros(1)})
        raise RuntimeError("crash after step 3")
    crashed = json.loads((tmp_path / "progress.json").read_text())
    assert (crashed["step"], crashed["samples"], crashed["tokens"]) == (3, 24, 192)
    with rtj_trainer.Session() as session:
        start, _ = session.load()
        session.step(start + 1, samples=8, tokens=64)
    resumed = json.loads((tmp_path / "progress.json").read_text())
    assert (start, resumed["step"], resumed["samples"], resumed["tokens"]) == (2, 3, 24, 192)


def test_a_session_resumes_from_the_newest_checkpoint_that_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _one_rank_outside_a_pod(monkeypatch)
    with rtj_trainer.Session(checkpoint_dir=tmp_path) as session:
        for step in (2, 4):
            session.save(step, {"w": torch.full((8,), float(step))})
    flip_a_bit(checkpoint.shard_path(tmp_path, 4, 0))
    with rtj_trainer.Session(checkpoint_dir=tmp_path) as session:
        step, state = session.load()
    assert step == 2 and state is not None and torch.equal(state["w"], torch.full((8,), 2.0))
    assert [c.step for c in checkpoint.list_checkpoints(tmp_path)] == [2]
    assert [p.name.rsplit("-", 1)[0] for p in tmp_path.glob("corrupt-*")] == ["corrupt-step-000000004"]
