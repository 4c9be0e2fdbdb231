"""The memory tier (rtj_trainer.reference.replica): flat buffers, the resume decision, and replication between
real gloo ranks in real processes.

The multi-rank tests run this file as a script, one process per rank (``python test_replica.py
<scenario> <role> <rank> <store port> <out dir>``); the test process hosts the TCPStore, so the store
outlives any rank, and the ranks write what they saw as JSON into the test's temporary directory.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from rtj_trainer.reference import model as model_mod
from rtj_trainer.reference import replica
from rtj_trainer.reference.replica import Layout, RankReport, ResumePlan, Transfer, plan_resume

# Torch and gloo only (the memory replica): `make test` runs these on .venv's NVRx, not again on
# 0.7.0. The checkpoint tests are not: the async writer is NVRx's PersistentAsyncCaller.
pytestmark = pytest.mark.nvrx_independent

STRIDE = 2  # ranks per "node"
PG_TIMEOUT = dt.timedelta(seconds=60)
PROCESS_TIMEOUT = 180.0
MODEL_ROLES = [("survivor", 0), ("lost", 1), ("spare", 1)]


def state_of(index: int, step: int) -> dict[str, torch.Tensor]:
    """A rank's state after ``step`` steps: mixed dtypes, a 0-dim step, an empty tensor, and shapes
    that depend on the index (FSDP shards are uneven)."""
    g = torch.Generator().manual_seed(1000 * index + step)
    rows = 3 + index
    return {
        "model/w": torch.randn(rows, 4, generator=g),
        "model/b": torch.randn(5, generator=g).to(torch.bfloat16),
        "optim-sharded/w/exp_avg": torch.randn(rows, 4, generator=g),
        "optim-plain/w/step": torch.tensor(float(step)),
        "counts": torch.randint(0, 1 << 40, (2, index + 1), generator=g),
        "mask": torch.rand(7, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
    }


def same_bytes(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """Bit for bit, names, dtypes and shapes included."""

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().reshape(-1).view(torch.uint8)

    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(raw(a[k]), raw(b[k])) for k in a
    )


# --- flat buffers -------------------------------------------------------------------------------


def test_flatten_round_trip_keeps_every_dtype_shape_and_bit() -> None:
    tensors = state_of(2, 5) | {
        "half": torch.randn(3, dtype=torch.float16),
        "complex": torch.randn(2, dtype=torch.complex128),
        "transposed": torch.randn(4, 3).t(),  # not contiguous
        "scalar-int": torch.tensor(3, dtype=torch.int32),
    }
    flat, layout = replica.flatten(tensors)
    assert flat.dtype == torch.uint8 and flat.dim() == 1 and flat.numel() == layout.nbytes
    restored = replica.unflatten(flat, layout)
    assert restored.keys() == tensors.keys()
    for name, t in tensors.items():
        assert restored[name].dtype == t.dtype and restored[name].shape == t.shape, name
        assert torch.equal(restored[name], t), name
    assert restored["optim-plain/w/step"].dim() == 0
    assert all(e.offset % replica.ALIGNMENT == 0 for e in layout.entries)
    assert Layout.decode(layout.encode()) == layout


def test_layout_is_the_same_for_the_same_state_in_any_order() -> None:
    tensors = state_of(1, 3)
    reordered = dict(reversed(tensors.items()))
    assert Layout.of(reordered) == Layout.of(tensors) == Layout.of(state_of(1, 9))
    assert Layout.of(state_of(2, 3)).nbytes > Layout.of(tensors).nbytes


def test_flatten_into_names_what_does_not_match_the_layout() -> None:
    layout = Layout.of(state_of(0, 1))
    out = torch.empty(layout.nbytes, dtype=torch.uint8)
    with pytest.raises(
        ValueError, match=re.escape("tensor counts is torch.int64 (2, 2), layout says torch.int64 (2, 1)")
    ):
        replica.flatten_into(state_of(1, 1) | {"empty": torch.empty(0, 3)}, layout, out)
    with pytest.raises(ValueError, match=re.escape("missing ['mask'], unexpected []")):
        replica.flatten_into({k: v for k, v in state_of(0, 1).items() if k != "mask"}, layout, out)
    with pytest.raises(ValueError, match="layout needs"):
        replica.unflatten(out[:-1], layout)


def test_peer_offset_picks_another_node_or_at_least_another_rank() -> None:
    assert replica.peer_offset(8, 16) == 8
    assert replica.peer_offset(8, 8) == 1  # one node: the next rank
    assert replica.peer_offset(2, 3) == 2
    assert replica.peer_offset(4, 1) == 0  # a world of one replicates nothing


# --- the resume decision ------------------------------------------------------------------------


def report(index: int, live: int, of: int = -1, at: int = -1) -> RankReport:
    return RankReport(index=index, live_step=live, replica_of=of, replica_step=at)


def ring(world: int, step: int, live: Mapping[int, int] | None = None) -> list[RankReport]:
    """Every rank holds the replica of ``index - STRIDE`` at ``step``; ``live`` overrides live steps."""
    live = live or {}
    return [report(i, live.get(i, step), (i - STRIDE) % world, step) for i in range(world)]


def test_plan_resumes_from_memory_without_transfers_when_every_rank_survived() -> None:
    assert plan_resume(ring(4, 7)) == ResumePlan("memory", 7, ())


def test_plan_sends_lost_indices_their_state_from_the_holders() -> None:
    reports = ring(4, 7, live={2: -1, 3: -1})
    # The spares that took indices 2 and 3 hold no replica.
    reports[2], reports[3] = report(2, -1), report(3, -1)
    assert plan_resume(reports) == ResumePlan("memory", 7, (Transfer(0, 2), Transfer(1, 3)))


def test_plan_moves_a_replica_to_a_rank_that_also_sends_one() -> None:
    # Index 1 lost its live state but still holds index 3's replica; index 3 lost its live state too.
    reports = ring(4, 7, live={1: -1, 3: -1})
    assert plan_resume(reports) == ResumePlan("memory", 7, (Transfer(3, 1), Transfer(1, 3)))


def test_plan_falls_back_to_the_checkpoint() -> None:
    # Three nodes: index 2 is lost, and so is index 4, which held index 2's replica (index 4's own
    # replica survives on index 0).
    lost_with_holder = ring(6, 7)
    lost_with_holder[2], lost_with_holder[4] = report(2, -1), report(4, -1)
    older_replica = [report(0, 7, 2, 7), report(1, 7, 3, 6), report(2, -1), report(3, -1)]
    cases = {
        # Index 1 is a step behind and nobody holds its step-7 state; at step 6 index 0 has neither
        # a live state, nor a snapshot, nor a replica anywhere.
        "no live state or replica of step 7 for index 1; no live state or replica of step 6 for index 0": [
            report(0, 7, 2, 6),
            report(1, 6, 3, 6),
            report(2, 7),
            report(3, 7, 1, 6),
        ],
        "no live state or replica of step 7 for index 2": lost_with_holder,
        # Index 3's replica is older than the survivors' live state.
        "no live state or replica of step 7 for index 3": older_replica,
        "no rank holds a live state": [report(0, -1), report(1, -1)],
    }
    for reason, reports in cases.items():
        plan = plan_resume(reports)
        assert plan.source == "checkpoint" and plan.transfers == (), reason
        assert plan.step == -1
        assert re.fullmatch(reason, plan.reason), (reason, plan.reason)


def test_plan_rolls_survivors_back_to_their_snapshot_when_a_peer_was_lost_mid_exchange() -> None:
    # The survivors' live states went on to step 8, but the lost ranks (indices 2 and 3, now spares
    # with nothing) had not sent theirs: the replicas and the survivors' own snapshots are at 7.
    reports = [
        RankReport(0, 8, 2, 7, own_step=7),
        RankReport(1, 8, 3, 7, own_step=7),
        RankReport(2, -1, -1, -1),
        RankReport(3, -1, -1, -1),
    ]
    plan = plan_resume(reports)
    assert plan == ResumePlan("memory", 7, (Transfer(0, 2), Transfer(1, 3)), snapshots=(0, 1))
    # Were the replicas at 8 too, everyone would resume at 8 with no snapshot.
    newer = [RankReport(0, 8, 2, 8, 8), RankReport(1, 8, 3, 8, 8), reports[2], reports[3]]
    assert plan_resume(newer) == ResumePlan("memory", 8, (Transfer(0, 2), Transfer(1, 3)))


def test_plan_resumes_at_the_generation_before_when_an_exchange_was_cut_unevenly() -> None:
    """Seen in `rtj demo` with two node losses: indices 2 and 3 (on a hot spare's pod since the first)
    are at step 103 when worker 0's node, indices 0 and 1, goes in the middle of the exchange of step
    103. Index 2 got index 0's replica of 103 (keeping 102 as the generation before); index 3 did not
    get index 1's and holds its 102. No step has a source for every index in the newest generation;
    at 102 every index has one: the replicas of 102 and the survivors' own snapshots."""
    reports = [
        RankReport(0, -1, -1, -1),
        RankReport(1, -1, -1, -1),
        RankReport(2, 103, 0, 103, own_step=103, previous_of=0, previous_step=102, previous_own_step=102),
        RankReport(3, 103, 1, 102, own_step=102, previous_of=1, previous_step=101, previous_own_step=101),
    ]
    plan = plan_resume(reports)
    assert plan == ResumePlan("memory", 102, (Transfer(2, 0), Transfer(3, 1)), snapshots=(2, 3))
    # With only the newest generation (as before), the world fell back to the checkpoint.
    forgotten = {"previous_of": -1, "previous_step": -1, "previous_own_step": -1}
    newest_only = [dataclasses.replace(r, **forgotten) for r in reports]
    assert plan_resume(newest_only).source == "checkpoint"


def test_a_report_lists_both_generations_newest_first() -> None:
    held = RankReport(2, 9, 0, 9, own_step=9, previous_of=0, previous_step=8, previous_own_step=8)
    assert held.replicas() == ((0, 9), (0, 8)) and held.own_steps() == (9, 8)
    assert RankReport(1, -1, -1, -1).replicas() == () and RankReport(1, -1, -1, -1).own_steps() == ()


def test_plan_for_a_world_of_one() -> None:
    assert plan_resume([report(0, 4)]) == ResumePlan("memory", 4, ())
    assert plan_resume([report(0, -1)]).source == "checkpoint"


def test_a_replica_whose_bytes_changed_while_held_is_never_offered_for_a_resume(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A held replica as replicate() keeps it (its CRC-32 taken on arrival), in a world of one so
    # that gather_reports' all_gather is the real one.
    payload, layout = replica.flatten(state_of(0, 3))
    tier = replica.MemoryTier(stride=STRIDE)
    tier.replica = replica.Replica(3, 0, 1, payload, layout.encode(), replica.crc32(payload))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        [intact] = replica.gather_reports(tier, -1, 0, 1, torch.device("cpu"))
        assert (intact.replica_of, intact.replica_step) == (0, 3)
        payload[payload.numel() // 2] ^= 1  # one bit, as a failing DIMM or a buffer reused too early
        [corrupt] = replica.gather_reports(tier, -1, 0, 1, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert (corrupt.replica_of, corrupt.replica_step) == (-1, -1)
    assert "the replica of index 0 at step 3 is corrupt" in caplog.text
    # Without it nobody holds index 0's state: the resume comes from the checkpoint.
    assert plan_resume([corrupt]).source == "checkpoint"


def test_plan_rejects_reports_out_of_order() -> None:
    with pytest.raises(ValueError, match=r"indices 0\.\.1 in order"):
        plan_resume([report(1, 3), report(0, 3)])


# --- real ranks ---------------------------------------------------------------------------------


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def start_rank(scenario: str, role: str, rank: int, port: int, out: Path) -> subprocess.Popen[bytes]:
    trainer_root = str(Path(replica.__file__).resolve().parents[1])
    env = os.environ | {"PYTHONPATH": os.pathsep.join([trainer_root, os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, __file__, scenario, role, str(rank), str(port), str(out)]
    with (out / f"{role}-{rank}.log").open("wb") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_all(procs: list[subprocess.Popen[bytes]], out: Path) -> None:
    try:
        codes = [p.wait(timeout=PROCESS_TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = "\n".join(f"--- {f.name}\n{f.read_text()}" for f in sorted(out.glob("*.log")))
    assert codes == [0] * len(procs), logs


def result(out: Path, role: str, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"{role}-{rank}.json").read_text())
    return data


def test_spares_get_the_lost_ranks_state_from_their_holders_bit_for_bit(
    store: dist.TCPStore,
    tmp_path: Path,
) -> None:
    """Four ranks on two "nodes" replicate three steps; ranks 1 and 3 get their state back from each
    other (an in-process restart); ranks 2 and 3 (the second node) are lost. In a new world, the
    survivors (same processes, same memory) and two spares that took indices 2 and 3 plan a resume
    from memory at step 3, and the spares receive exactly the lost state."""
    procs = [start_rank("ring", "survivor", r, store.port, tmp_path) for r in (0, 1)]
    procs += [start_rank("ring", "lost", r, store.port, tmp_path) for r in (2, 3)]
    procs += [start_rank("ring", "spare", r, store.port, tmp_path) for r in (2, 3)]
    wait_all(procs, tmp_path)
    for role, rank in [("survivor", 0), ("survivor", 1), ("lost", 2), ("lost", 3)]:
        held = result(tmp_path, role, rank)["replicated"]
        assert held == {"replica_of": (rank - STRIDE) % 4, "replica_step": 3, "equal": True}, (role, rank)
        # Two host buffers take turns: the one of step 1 receives step 3.
        first, second, third = result(tmp_path, role, rank)["buffers"]
        assert first == third != second
        swap = result(tmp_path, role, rank)["swap"]
        assert swap["plan"] == {"source": "memory", "step": 3, "transfers": [[3, 1], [1, 3]], "reason": ""}
        assert swap["equal"] is (True if rank % 2 else None), (role, rank)
    expected_plan = {"source": "memory", "step": 3, "transfers": [[0, 2], [1, 3]], "reason": ""}
    for role, rank in [("survivor", 0), ("survivor", 1), ("spare", 2), ("spare", 3)]:
        assert result(tmp_path, role, rank)["plan"] == expected_plan, (role, rank)
    assert result(tmp_path, "survivor", 0)["received"] is None
    assert result(tmp_path, "survivor", 1)["received"] is None
    assert result(tmp_path, "spare", 2)["received"] == {"equal": True}
    assert result(tmp_path, "spare", 3)["received"] == {"equal": True}


def test_a_spare_continues_the_lost_ranks_fsdp_training_exactly(
    store: dist.TCPStore,
    tmp_path: Path,
) -> None:
    """The example model (FSDP2, Adam) on two ranks of one "node": each step's local state is
    replicated (to the next rank: a single node). Rank 1 is lost after step 2. In a new world the
    survivor restores its own step-2 state, a spare that never trained gets rank 1's from rank 0's
    replica (no expected layout: a fresh optimizer has no state yet), and step 3 of both then equals,
    bit for bit, the step 3 the original ranks computed."""
    procs = [start_rank("model", role, r, store.port, tmp_path) for role, r in MODEL_ROLES]
    wait_all(procs, tmp_path)
    for role, rank in [("survivor", 0), ("spare", 1)]:
        plan = result(tmp_path, role, rank)["plan"]
        assert plan == {"source": "memory", "step": 2, "transfers": [[0, 1]], "reason": ""}, role
    for rank in (0, 1):
        reference = torch.load(tmp_path / f"reference-{rank}.pt")
        resumed = torch.load(tmp_path / f"resumed-{rank}.pt")
        assert any(k.startswith(model_mod.OPTIM_SHARDED_PREFIX) for k in reference), rank
        assert same_bytes(resumed, reference), rank


def test_the_generation_before_is_kept_and_served_until_the_next_exchange(
    store: dist.TCPStore,
    tmp_path: Path,
) -> None:
    """Two ranks replicate steps 1, 2 and 3. Each reports both generations (3 and 2) in a real
    all_gather; rank 0 sends rank 1 its replica of step 2 (the generation before) and rank 1 gets
    exactly its state of step 2 back, while rank 0 rolls back to its own snapshot of step 2. After
    step 4 the generation before is 3: step 2 is gone, its buffer reused."""
    procs = [start_rank("generations", "pair", r, store.port, tmp_path) for r in (0, 1)]
    wait_all(procs, tmp_path)
    first, second = result(tmp_path, "pair", 0), result(tmp_path, "pair", 1)
    assert first["reports"] == second["reports"] == [[0, 3, 1, 3, 3, 1, 2, 2], [1, 3, 0, 3, 3, 0, 2, 2]]
    assert first["own_2"] is True and second["received_2"] is True
    assert first["after_4"] == second["after_4"] == {"replica": 4, "previous": 3, "own": [4, 3]}


@pytest.mark.parametrize(
    ("failure", "errors"),
    [
        ("peer-stalls-half-way", ("Timed out",)),
        # gloo reads a dead peer's socket as closed, or as reset when data was still unread.
        ("peer-dies-half-way", ("Connection closed by peer", "Connection reset by peer")),
    ],
)
def test_an_interrupted_replicate_keeps_the_previous_replica(
    store: dist.TCPStore,
    tmp_path: Path,
    failure: str,
    errors: tuple[str, ...],
) -> None:
    """Two ranks replicate steps 1 and 2; half way through step 3 rank 1 stalls (rank 0 times out)
    or dies: rank 0's replicate fails and it still holds rank 1's state of step 2, bit for bit."""
    procs = [start_rank(failure, "holder", 0, store.port, tmp_path)]
    procs += [start_rank(failure, "peer", 1, store.port, tmp_path)]
    wait_all(procs, tmp_path)
    held = result(tmp_path, "holder", 0)
    assert any(error in held["error"] for error in errors), held["error"]
    assert held["held"] == {"replica_of": 1, "replica_step": 2, "equal": True}


# --- the rank processes -------------------------------------------------------------------------


def join(prefix: str, rank: int, world: int, port: int, timeout: dt.timedelta = PG_TIMEOUT) -> None:
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=PG_TIMEOUT)
    store = dist.PrefixStore(prefix, client)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)


def holds(tier: replica.MemoryTier, index: int, step: int) -> dict[str, Any]:
    held = tier.replica
    equal = held is not None and same_bytes(
        replica.unflatten(held.payload, held.layout), state_of(index, step)
    )
    return {"replica_of": tier.replica_of, "replica_step": tier.replica_step, "equal": equal}


def write(out: Path, role: str, rank: int, data: dict[str, Any]) -> None:
    (out / f"{role}-{rank}.json").write_text(json.dumps(data))


def plan_json(plan: ResumePlan) -> dict[str, Any]:
    transfers = [[t.holder, t.receiver] for t in plan.transfers]
    return {"source": plan.source, "step": plan.step, "transfers": transfers, "reason": plan.reason}


def swap_odd_ranks_state(tier: replica.MemoryTier, rank: int) -> dict[str, Any]:
    """An in-process restart in the first world: ranks 1 and 3 lost their live state (say, in the
    middle of an optimizer step) and each holds the other's replica: both send and receive. (Their
    own snapshots would serve them without an exchange: set aside here, as if lost too.)"""
    live_step = -1 if rank % 2 else 3
    own, tier.own = tier.own, (None if rank % 2 else tier.own)
    plan = plan_resume(replica.gather_reports(tier, live_step, rank, 4, torch.device("cpu")))
    tier.own = own
    state = replica.execute_transfers(plan, tier, rank, Layout.of(state_of(rank, 0)))
    return {"plan": plan_json(plan), "equal": None if state is None else same_bytes(state, state_of(rank, 3))}


def ring_rank(role: str, rank: int, port: int, out: Path) -> None:
    tier = replica.MemoryTier(stride=STRIDE)
    data: dict[str, Any] = {}
    if role != "spare":
        join("first", rank, 4, port)
        buffers = []
        for step in (1, 2, 3):
            tier.replicate(step, state_of(rank, step))
            assert tier.replica is not None
            buffers.append(tier.replica.payload.data_ptr())
        data["replicated"] = holds(tier, (rank - STRIDE) % 4, 3)
        data["buffers"] = buffers
        data["swap"] = swap_odd_ranks_state(tier, rank)
        dist.barrier()  # every send delivered before the second node goes
        dist.destroy_process_group()
    if role == "lost":
        write(out, role, rank, data)
        return
    join("second", rank, 4, port)
    live_step = 3 if role == "survivor" else -1
    reports = replica.gather_reports(tier, live_step, rank, 4, torch.device("cpu"))
    plan = plan_resume(reports)
    data["plan"] = plan_json(plan)
    expected = Layout.of(state_of(rank, 0))
    state = replica.execute_transfers(plan, tier, rank, expected)
    data["received"] = None if state is None else {"equal": same_bytes(state, state_of(rank, 3))}
    dist.destroy_process_group()
    write(out, role, rank, data)


def fresh_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = model_mod.shard_model(model_mod.build_model(model_mod.ModelConfig(), torch.device("cpu")), "cpu")
    return model, torch.optim.Adam(model.parameters(), lr=3e-3)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    cfg = model_mod.ModelConfig()
    inputs, targets = model_mod.batch_for_step(cfg, step, rank, model_mod.transition_table(cfg))
    torch.nn.functional.cross_entropy(model(inputs), targets.reshape(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def copied(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tensors.items()}


def model_rank(role: str, rank: int, port: int, out: Path) -> None:
    tier = replica.MemoryTier(stride=STRIDE)
    live: dict[str, torch.Tensor] = {}
    if role != "spare":
        join("first", rank, 2, port)
        model, opt = fresh_model()
        for step in (0, 1):
            train_step(model, opt, step, rank)
            tier.replicate(step + 1, model_mod.local_state(model, opt))
        live = copied(model_mod.local_state(model, opt))
        train_step(model, opt, 2, rank)  # what the original ranks make of step 3
        torch.save(copied(model_mod.local_state(model, opt)), out / f"reference-{rank}.pt")
        dist.destroy_process_group()
    if role == "lost":
        return
    join("second", rank, 2, port)
    model, opt = fresh_model()
    reports = replica.gather_reports(tier, 2 if live else -1, rank, 2, torch.device("cpu"))
    plan = plan_resume(reports)
    received = replica.execute_transfers(plan, tier, rank)
    model_mod.restore_local_state(model, opt, live if received is None else received)
    train_step(model, opt, 2, rank)
    torch.save(copied(model_mod.local_state(model, opt)), out / f"resumed-{rank}.pt")
    write(out, role, rank, {"plan": plan_json(plan)})
    dist.destroy_process_group()


def half_way_through_step_3(failure: str, rank: int, state: dict[str, torch.Tensor], port: int) -> None:
    """The peer's side of step 3: the headers are exchanged as ``replicate`` does, then the peer
    either stalls (alive, sends nothing more) or takes the holder's state, sends its own state but
    dies before its layout: the new bytes arrive, the exchange does not complete."""
    layout = Layout.of(state)
    header = torch.tensor([3, rank, layout.nbytes, layout.encode().numel()], dtype=torch.long)
    holder_header = torch.empty(replica.HEADER_FIELDS, dtype=torch.long)
    for work in [dist.isend(header, dst=0), dist.irecv(holder_header, src=0)]:
        work.wait()
    if failure == "peer-dies-half-way":
        nbytes, layout_len = int(holder_header[2]), int(holder_header[3])
        payloads = [torch.empty(nbytes, dtype=torch.uint8), torch.empty(layout_len, dtype=torch.uint8)]
        for work in [dist.irecv(t, src=0) for t in payloads]:
            work.wait()
        dist.send(replica.flatten(state)[0], dst=0)  # the state of step 3, but not its layout
        os._exit(0)
    dist.TCPStore("127.0.0.1", port, is_master=False).wait([f"{failure}/holder-done"])
    os._exit(0)


def interrupted_rank(failure: str, role: str, rank: int, port: int, out: Path) -> None:
    join(failure, rank, 2, port)
    tier = replica.MemoryTier(stride=STRIDE)
    for step in (1, 2):
        tier.replicate(step, state_of(rank, step))
    state3 = state_of(rank, 3)
    if role == "peer":
        half_way_through_step_3(failure, rank, state3, port)
    error = ""
    # A stalled peer is found by the timeout; a dead one by its closed connection, however long a
    # loaded machine takes to run it up to its death (a short timeout would fire first).
    timeout = dt.timedelta(seconds=3 if failure == "peer-stalls-half-way" else 60)
    try:
        tier.replicate(3, state3, timeout=timeout)
    except RuntimeError as e:
        error = str(e) or type(e).__name__
    write(out, role, rank, {"error": error, "held": holds(tier, 1, 2)})
    dist.TCPStore("127.0.0.1", port, is_master=False).set(f"{failure}/holder-done", "1")
    os._exit(0)  # the group is broken: no orderly teardown


def generations_rank(role: str, rank: int, port: int, out: Path) -> None:
    join("generations", rank, 2, port)
    tier = replica.MemoryTier(stride=STRIDE)
    for step in (1, 2, 3):
        tier.replicate(step, state_of(rank, step))
    reports = replica.gather_reports(tier, 3, rank, 2, torch.device("cpu"))
    data: dict[str, Any] = {"reports": [dataclasses.astuple(r) for r in reports]}
    # Rank 1 lost its live state; both go back to step 2, the generation before.
    plan = ResumePlan("memory", 2, (Transfer(0, 1),), snapshots=(0,))
    received = replica.execute_transfers(plan, tier, rank, Layout.of(state_of(rank, 0)))
    if rank == 0:
        data["own_2"] = same_bytes(replica.own_state(tier, 2), state_of(0, 2))
    else:
        data["received_2"] = received is not None and same_bytes(received, state_of(1, 2))
    tier.replicate(4, state_of(rank, 4))
    assert tier.replica is not None and tier.previous is not None
    assert tier.own is not None and tier.previous_own is not None
    own_steps = [tier.own.step, tier.previous_own.step]
    data["after_4"] = {"replica": tier.replica.step, "previous": tier.previous.step, "own": own_steps}
    dist.destroy_process_group()
    write(out, role, rank, data)


def main(argv: list[str]) -> None:
    scenario, role, rank, port, out = argv[0], argv[1], int(argv[2]), int(argv[3]), Path(argv[4])
    if scenario == "generations":
        generations_rank(role, rank, port, out)
    elif scenario == "ring":
        ring_rank(role, rank, port, out)
    elif scenario == "model":
        model_rank(role, rank, port, out)
    else:
        interrupted_rank(scenario, role, rank, port, out)


if __name__ == "__main__":
    main(sys.argv[1:])
